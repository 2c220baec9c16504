"""Image grids: originals over their matched reconstructions, or reconstructions alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

_SCALE = 2
# Grey (one channel) and colour (three) images can be drawn.
DRAWABLE_CHANNELS = (1, 3)


def save_grid(originals: np.ndarray, reconstructed: np.ndarray, path: Path) -> Path:
    """Two rows of images (B x C x H x W on [0, 1], C 1 or 3): originals on top, matched
    reconstructions below (black where a sample got none); values outside [0, 1] clipped."""
    return _save([originals, reconstructed], path)


def save_row(images: np.ndarray, path: Path) -> Path:
    """One row of images (B x C x H x W on [0, 1], C 1 or 3), for reconstructions that have no
    ground truth beside them; values outside [0, 1] clipped."""
    return _save([images], path)


def _save(rows: list[np.ndarray], path: Path) -> Path:
    b, c, h, w = rows[0].shape
    if c not in DRAWABLE_CHANNELS:
        raise ValueError(f"images of {c} channels: only {DRAWABLE_CHANNELS} can be drawn")
    canvas = np.zeros((len(rows) * (h + 2), b * (w + 2), 3))
    for r, images in enumerate(rows):
        for i in range(b):
            # A grey image's one channel broadcasts to the three of the canvas.
            canvas[r * (h + 2) + 1 : r * (h + 2) + 1 + h, i * (w + 2) + 1 : i * (w + 2) + 1 + w] = (
                images[i].transpose(1, 2, 0)
            )
    pixels = (np.clip(canvas, 0, 1) * 255).round().astype(np.uint8)
    image = Image.fromarray(pixels).resize(
        (canvas.shape[1] * _SCALE, canvas.shape[0] * _SCALE), Image.Resampling.NEAREST
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path
