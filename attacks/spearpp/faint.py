"""Samples fainter than the batch size's rank: the directions they add to the span of the
inputs and to the next layer's row space, for the row-space fit (noiseless float64 updates).

A network that fits some samples almost perfectly sends gradients for them at the level of the
round-off: m=1000 trained 40 epochs, attacked on 150 of its own training images, 9 samples stand
2 to 70 times above the bulk of the round-off, past B_hat = 141 (`weak_rank.ABOVE_BULK` counts
samples only 1e3 times above it, since a search on a direction that close to the bulk is off by
its share). Left out, they tilt both spans by their share: the others' inputs from the next
layer's row space came back off by up to 1e-2 of their norm (127 of the 141 found inputs exact,
119 held by the residual test). Each faint sample adds one direction to the first layer's input
span and one to the next layer's row space: with those standing :data:`FAINT` times above the
bulk in the first layer's spectrum added to both, 136 of the 141 came back exact and 127 held.
Only the fit uses them; the columns and the certificate's comparison with their inputs stay at
B_hat.
"""

from __future__ import annotations

import torch

from attacks.spearpp.hidden import InputSpan, row_space_sketch
from attacks.spearpp.weak_rank import FLAT, bulk_level

# A direction counts as a faint sample's where it stands this far above the bulk's median: the
# bulk's own top stays within FLAT of it.
FAINT = FLAT
# Power iterations of the sketch: the faint values stand only a few times above the bulk.
_POWER_ITERATIONS = 2


def faint_count(singular_values: torch.Tensor, rank: int) -> int:
    """How many computed singular values past ``rank`` stand :data:`FAINT` times above the
    bulk's median (0 where no flat bulk was computed)."""
    level = bulk_level(singular_values, rank)
    if level is None:
        return 0
    return max(0, int((singular_values > FAINT * level).sum()) - rank)


def faint_rows(grad: torch.Tensor, rows: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` leading right singular directions (count x n, orthonormal) of ``grad``
    (k x n) off the orthonormal ``rows`` (r x n), from the seeded sketch of its row space
    (:func:`hidden.row_space_sketch`; the attack's own draws are untouched)."""
    rest = grad - (grad @ rows.T) @ rows
    sketch = row_space_sketch(rest, count, _POWER_ITERATIONS)
    directions = (sketch @ torch.linalg.svd(rest @ sketch, full_matrices=False).Vh[:count].T).T
    # Off ``rows`` again: the projection above leaves their round-off in ``rest``.
    directions = directions - (directions @ rows.T) @ rows
    orthonormal: torch.Tensor = torch.linalg.qr(directions.T).Q.T
    return orthonormal


def with_faint(
    span: InputSpan,
    space: torch.Tensor,
    grad_weight: torch.Tensor,
    weight: torch.Tensor,
    next_grad: torch.Tensor,
    count: int,
) -> tuple[InputSpan, torch.Tensor]:
    """The input span and the next layer's row space (m x r) with ``count`` faint samples'
    directions added to each: the first layer's off the span, the next layer's (``next_grad``,
    k x m) off ``space``."""
    if count <= 0:
        return span, space
    inputs = faint_rows(grad_weight, span.basis, count)
    hidden = faint_rows(next_grad, space.T, count)
    return span.extended(inputs, weight), torch.cat([space, hidden.T], dim=1)
