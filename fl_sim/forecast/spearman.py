"""Spearman's rank correlation: how well a proxy orders samples by an attack's error."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.stats import spearmanr


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
