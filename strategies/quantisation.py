"""What Flower's SecAgg+ quantisation adds to the aggregate, as the server can work it out."""

from __future__ import annotations

import math
from collections.abc import Sequence


def secagg_noise_std(
    num_examples: Sequence[int],
    clipping_range: float,
    quantization_range: int,
    max_weight: float,
) -> float:
    """Per-entry std of the error SecAgg+'s quantisation leaves in the averaged weights.

    Each client ``i`` scales its weights by ``q_i / R``, ``q_i = round(n_i / max_weight * R)``
    (``R`` the quantisation range), and rounds them stochastically to the grid of step
    ``2 c / R`` (``c`` the clipping range): an unbiased error of variance ``f (1 - f)`` steps
    squared for a fractional part ``f``, ``1 / 6`` on average over fractional parts spread
    evenly (weights many steps apart). The server sums the ``K`` clients' integers and divides
    by ``sum q_i / R``, so the average carries ``2 c sqrt(K / 6) / sum q_i`` per entry. Only
    settings and weights the server knows enter: the workflow's and each ``num-examples``.

    Parameters
    ----------
    num_examples
        Every summed client's weight (``num-examples``).
    clipping_range, quantization_range, max_weight
        ``SecAggPlusWorkflow``'s settings.
    """
    q_total = sum(round(n / max_weight * quantization_range) for n in num_examples)
    if q_total <= 0:
        raise ValueError(f"num_examples={list(num_examples)!r}: nothing was summed")
    return 2 * clipping_range * math.sqrt(len(num_examples) / 6) / q_total
