"""Found samples' input coordinates from the next layer's gradient (one-step updates).

In one step the next linear layer's weight gradient is G' = sum_i w_i h_i^T, with
h_i = relu(W x_i + b) sample i's hidden vector, so its row space is the span of the B hidden
vectors. A found column's zero pattern says which neurons its sample leaves active (D_k), and
the sample's coordinates p enter h_k = D_k (A p + b) linearly: requiring h_k in that row space
is m equations in B unknowns, whose least-squares solution is p_k itself, scale included, from
the column alone. All the first layer gives is the max-margin fit to the m signs, degrees off
where m / B is small or the patterns are shared (trained networks), and the sign rounds deflate
by those estimates: at m=1000, B=100 on a network trained to 53% test accuracy, deflating by
the exact coordinates let the rounds find 100 of 100 columns where the fits let them find 91.

A pattern that is not one sample's (a wrong column) leaves a residual far above round-off, so
each estimate is used only where its residual is small, and the max-margin fit elsewhere: a
multi-step update's hidden vectors move between steps and fit no B-dimensional space.
"""

from __future__ import annotations

import torch

from attacks.spearpp.inputs import NextLayer
from attacks.spearpp.signs import GATHER_ELEMENTS

# Gap between the B-th and (B + 1)-th singular values of G' that says its rank is B: below it
# the hidden vectors do not span a B-dimensional space (a multi-step update, noise, or a next
# layer narrower than the batch).
RANK_GAP = 1e3
# Random mixes beyond B that sketch the row space (see hidden_space).
_OVERSAMPLE = 8
# Relative residual of h_k off the row space under which an estimate is a sample's.
RESIDUAL = 1e-6


def hidden_space(next_layer: NextLayer, batch_size: int) -> torch.Tensor | None:
    """Orthonormal basis (m x B) of the row space of the next layer's weight gradient, or
    ``None`` where its rank is not ``batch_size`` (see :data:`RANK_GAP`).

    The range of G'^T is sketched from random mixes of its columns (k x m with k = m at
    m = 4000: one full SVD costs tens of seconds, the sketch one product): with rank B exactly,
    B + :data:`_OVERSAMPLE` mixes hold the whole row space, and the sketch's (B + 1)-th singular
    value (no larger than the gradient's own) says whether there is more.
    """
    grad = next_layer.grad_weight
    if grad.shape[0] < batch_size:
        return None
    width = min(batch_size + _OVERSAMPLE, *grad.shape)
    generator = torch.Generator(grad.device).manual_seed(0)
    mixes = torch.randn(
        grad.shape[0], width, generator=generator, dtype=grad.dtype, device=grad.device
    )
    sketch = torch.linalg.qr(grad.T @ mixes).Q  # m x width
    _, values, right = torch.linalg.svd(grad @ sketch, full_matrices=False)
    weakest = float(values[batch_size - 1])
    after = float(values[batch_size]) if values.shape[0] > batch_size else 0.0
    if weakest <= RANK_GAP * after or weakest <= 0.0:
        return None
    space: torch.Tensor = sketch @ right[:batch_size].T
    return space


def hidden_inputs(
    affine: torch.Tensor, active: torch.Tensor, space: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pattern's coordinates with its hidden vector in ``space``, and their residuals.

    Parameters
    ----------
    affine
        [A, b] (m x (B + 1)): the pre-activations of the coordinates and the bias.
    active
        c x m boolean patterns.
    space
        m x r orthonormal basis (:func:`hidden_space`, restricted to the rows of ``affine``).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        The coordinates p (c x B) minimising |(I - S S^T) D (A p + b)|, and that minimum
        relative to |D (A p + b)| (c).
    """
    m, width = affine.shape
    chunk = max(1, GATHER_ELEMENTS // (m * width))
    coords, residuals = [], []
    for part in active.split(chunk):
        masked = part.to(affine.dtype)[:, :, None] * affine  # c x m x (B + 1)
        off = masked - space @ (space.T @ masked)
        p = torch.linalg.lstsq(off[..., :-1], -off[..., -1:]).solution  # c x B x 1
        full = torch.cat([p, torch.ones_like(p[:, :1])], dim=1)
        size = (masked @ full).flatten(1).norm(dim=1).clamp_min(torch.finfo(p.dtype).tiny)
        residual = (off @ full).flatten(1).norm(dim=1) / size
        coords.append(p[..., 0])
        residuals.append(residual)
    return torch.cat(coords), torch.cat(residuals)
