"""Samples of a float64 gradient under the precision floor but above its round-off."""

from __future__ import annotations

import math

import torch

# A float64 spectrum's round-off relative to s_1, and the gap under a singular value above it
# that makes it a sample's.
FLOAT64_ROUNDOFF = 1e-12
WEAK_GAP = 1e3


def weak_rank(s: torch.Tensor, rank: int, threshold: float) -> tuple[int, float]:
    """The rank of a float64 spectrum ``s`` counting its weak samples, and the threshold
    between them and the rest; ``rank`` and ``threshold`` where there are none.

    The largest r >= ``rank`` with s_r above :data:`FLOAT64_ROUNDOFF` of s_1 and
    s_r / s_{r+1} >= :data:`WEAK_GAP` (a rank-deficient gradient's round-off tail can fall
    off as steeply, below that level: a 20-sample batch at m=60 was read as 59).

    A network that fits a sample almost perfectly sends a gradient for it thousands of times
    weaker than the others' (m=200 trained 60 epochs, B=30 unseen images: one at 3.6e-10 of
    s_1, under the 1e-9 floor, round-off at 1.7e-15). Left out, its direction is missing from
    every sample's input space, and no sample of the batch came back exact.
    """
    for r in range(s.shape[0] - 1, rank, -1):
        if float(s[r - 1]) > FLOAT64_ROUNDOFF * float(s[0]) and s[r - 1] >= WEAK_GAP * s[r]:
            return r, math.sqrt(float(s[r - 1] * s[r]))
    return rank, threshold
