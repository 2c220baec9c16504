"""Spearman's rank correlation: how well a proxy orders samples by an attack's error."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata, spearmanr


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float | None:
    """Spearman's rho of two paired samples, ties sharing their average rank.

    Returns ``None`` where it is undefined: fewer than 3 pairs, or a constant sample.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"need two 1-D samples of equal length, got {x.shape} and {y.shape}")
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    rho = float(spearmanr(x, y).statistic)
    return rho if math.isfinite(rho) else None


def spearman_interval(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of Spearman's rho (pairs resampled with replacement).

    Returns ``None`` where rho itself is undefined; resamples on which it is undefined (a
    constant draw) are skipped.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if spearman(x, y) is None:
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(x), (resamples, len(x)))
    # All resamples at once: average ranks per row, then Pearson of the ranks per row.
    rx, ry = rankdata(x[picks], axis=1), rankdata(y[picks], axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    norms = np.sqrt((rx**2).sum(axis=1) * (ry**2).sum(axis=1))
    defined = norms > 0
    values = (rx * ry).sum(axis=1)[defined] / norms[defined]
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)
