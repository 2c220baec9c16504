"""Samples of a float64 gradient under the precision floor but above its round-off."""

from __future__ import annotations

import math

import torch

# The round-off past a float64 gradient's rank is a flat bulk: its largest value within FLAT of
# its median (measured 1.0 to 1.5 on memorised networks' gradients, m=200, full spectrum and
# randomised alike), over at least MIN_TAIL values. A rank-deficient gradient's round-off tail
# instead falls off by decades (a 20-sample batch at m=60 was once read as 59 off such a tail).
FLAT = 4.0
MIN_TAIL = 8
# A weak sample stands this far above the bulk's median. One 17 times above it (m=200 trained
# 60 epochs, own images, B=20, seed 1: 3.2e-14 of s_1) is itself 6% off, and counted it threw
# three other samples' zeros off (14 of 20 exact and none certified, 18 and 17 without it).
ABOVE_BULK = 1e3


def weak_rank(s: torch.Tensor, rank: int, threshold: float) -> tuple[int, float]:
    """The rank of a float64 spectrum ``s`` counting its weak samples, and the threshold
    between them and the rest; ``rank`` and ``threshold`` where there are none.

    The bulk: the computed singular values past the smallest r >= ``rank`` after which at least
    :data:`MIN_TAIL` of them are flat; weak samples: those under the floor and
    :data:`ABOVE_BULK` times above its median.

    A network that fits a sample almost perfectly sends a gradient for it thousands of times
    weaker than the others' (m=200 trained 60 epochs: samples at 3.6e-10 and 7.1e-11 of s_1,
    under the 1e-9 floor, the bulk at 1e-15 to 1e-14). Left out, its direction is missing from
    every sample's input space: the others' come back off by its share (B=30, unseen images:
    none exact).
    """
    level = bulk_level(s, rank)
    if level is None:
        return rank, threshold
    weak = int((s > ABOVE_BULK * level).sum())
    if weak <= rank:
        return rank, threshold
    return weak, math.sqrt(float(s[weak - 1]) * float(s[weak]))


def bulk_level(s: torch.Tensor, rank: int) -> float | None:
    """The median of a float64 spectrum's round-off bulk: the values past the smallest
    r >= ``rank`` after which at least :data:`MIN_TAIL` of them are flat (``None``: no such
    tail among the values computed)."""
    for r in range(max(rank, 1), s.shape[0] - MIN_TAIL + 1):
        level = float(s[r:].median())
        if float(s[r]) <= FLAT * level:
            return level
    return None
