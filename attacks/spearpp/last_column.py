"""The last missing column in closed form, from the other B - 1 and the bias gradient.

On trained networks a sample can be active on only one row where another, sparser sample is
not (or on none): that row is essential to its zero set, and the zeros alone cannot tell its
column from a mix pinned by a cancellation elsewhere, so the certificate refuses it and the
search cannot settle it. Its input can:

With the other B - 1 columns found, P Q = I puts the missing sample's input coordinates on the
unit vector c orthogonal to all of them: p_m = c / (c . q_m). The bias gradient gives
L^T dL/db = Q d = d_m q_m + sum_f d_f q_f, so c . L^T dL/db = d_m (c . q_m), and the input
x_m = p_m R / d_m = c R / (c . L^T dL/db) needs no q_m at all. Its inactive neurons
{j : W_j x_m + b_j <= 0} are then its column's zero set, whose null direction is the column.
"""

from __future__ import annotations

import torch

from attacks.spearpp.refine import ZeroRule, canonical_sign, zero_mask

# Singular values of the zero set's rows below this share of the largest are null: a second
# null direction means the zeros do not pin the column (the sample is zero wherever another
# is), and it is left to the search.
_NULL_SHARE = 1e-9
# |c . L^T dL/db| below this share of |L^T dL/db| leaves the sample's scale unknown.
_TINY_SCALE = 1e-12


def last_column(
    columns: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    grad_bias: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    rule: ZeroRule,
) -> torch.Tensor | None:
    """The missing column (B, unit, engine coordinates), or ``None`` when it is not settled.

    Parameters
    ----------
    columns
        The B - 1 found columns (unit rows).
    left, right
        The factors of the gradient, L (m x B, orthonormal columns) and R (B x n).
    grad_bias
        The layer's bias gradient (m).
    weight, bias
        The layer's weight (m x n) and bias (m).
    rule
        The zero rule the columns were found under: the column found here must have exactly
        its sample's inactive neurons as zeros under it.
    """
    b = left.shape[1]
    if columns.shape[0] != b - 1:
        return None
    c = torch.linalg.svd(columns.T, full_matrices=True)[0][:, -1]
    target = left.T @ grad_bias
    scale = c @ target
    if bool(scale.abs() <= _TINY_SCALE * target.norm()):
        return None
    inactive = weight @ (c @ right / scale) + bias <= 0
    if int(inactive.sum()) < b - 1:
        return None
    _, singular, vh = torch.linalg.svd(left[inactive], full_matrices=True)
    if bool(singular[b - 2] <= _NULL_SHARE * singular[0]):
        return None
    q = canonical_sign(vh[-1:])[0]
    # Round-off in the found columns or the inputs could move a row across: the column's zeros
    # must be its sample's inactive neurons exactly.
    if not bool((zero_mask(left, q[None], rule)[0] == inactive).all()):
        return None
    return q
