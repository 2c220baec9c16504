"""Heat-maps of tabular batches: the B x n matrix of the original records over that of their
matched reconstructions (the image grid's counterpart for records that are not images)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def save_heatmap(originals: np.ndarray, reconstructed: np.ndarray, path: Path) -> Path:
    """Originals on top, matched reconstructions below (B x n each, on the [0, 1] scale; a
    record that got no reconstruction shows as zeros); one row per record, one column per
    feature, on a colour scale fixed to [0, 1] so that both panels read alike (values beyond it
    saturate)."""
    fig = Figure(figsize=(6, 1.2 + 0.16 * 2 * originals.shape[0]))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, values, title in (
        (top, originals, "originals"),
        (bottom, reconstructed, "reconstructions (matched)"),
    ):
        shown = ax.imshow(values, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set(title=title, ylabel="record")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_xlabel("feature")
    fig.colorbar(shown, ax=[top, bottom], label="value on [0, 1]")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    return path
