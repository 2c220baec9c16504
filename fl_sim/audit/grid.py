"""Image grids: originals over their matched reconstructions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

_SCALE = 2


def save_grid(originals: np.ndarray, reconstructed: np.ndarray, path: Path) -> Path:
    """Two rows of 32x32 images (B x 3 x 32 x 32 on [0, 1]): originals on top, matched
    reconstructions below (black where a sample got none); values outside [0, 1] clipped."""
    b = originals.shape[0]
    canvas = np.zeros((2 * 34, b * 34, 3))
    for i in range(b):
        canvas[1:33, i * 34 + 1 : i * 34 + 33] = originals[i].transpose(1, 2, 0)
        canvas[35:67, i * 34 + 1 : i * 34 + 33] = reconstructed[i].transpose(1, 2, 0)
    pixels = (np.clip(canvas, 0, 1) * 255).round().astype(np.uint8)
    image = Image.fromarray(pixels).resize(
        (canvas.shape[1] * _SCALE, canvas.shape[0] * _SCALE), Image.Resampling.NEAREST
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path
