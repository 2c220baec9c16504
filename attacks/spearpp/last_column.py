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

Where the zero set's rows leave a second null direction, a combination of found columns f
(the sample is zero only where some found sample is, or where two found samples are active on
the same single row), no first-layer observation tells q_m from q_m + a q_f: G and the bias
gradient are the same for the inputs x_f - a' x_m in place of the x_f. Every other sample is
still fixed: a direction v of the null space outside the found columns' span completes the
basis with x_m exact (the formula above holds for any v with c . v != 0) and every sample but
the f's exact (their dual rows are orthogonal to v).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attacks.spearpp.refine import ZeroRule, canonical_sign, zero_mask

# Singular values of the zero set's rows below this share of the largest are null.
_NULL_SHARE = 1e-9
# A null space whose part along c is this small holds no new direction.
_ALONG = 1e-6
# Found columns weighing this share of the largest in the null space's part inside their span
# are the samples left uncertain.
_INVOLVED = 1e-6


@dataclass(frozen=True)
class LastColumn:
    """The last column, or a direction standing in for it.

    Attributes
    ----------
    column
        B, unit: the missing column when ``pinned``, else a direction of its null space outside
        the found columns, which completes the basis as well for every sample but the
        ``uncertain`` ones.
    pinned
        Whether the column is exact (its zeros pin it).
    uncertain
        The found columns whose combinations lie in that null space (k x B): their samples'
        inputs are not fixed.
    """

    column: torch.Tensor
    pinned: bool
    uncertain: torch.Tensor


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
) -> LastColumn | None:
    """The missing column (engine coordinates), or ``None`` when it is not settled.

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
    null = vh[int((singular > _NULL_SHARE * singular[0]).sum()) :]  # k x B
    # The found columns span all but c, so the null space meets their span in k - 1
    # dimensions: the direction standing in for the column is its part along c.
    along = null @ c
    if bool(along.norm() < _ALONG):
        return None
    uncertain = columns[:0]
    if null.shape[0] > 1:
        inside = torch.linalg.svd(along[None], full_matrices=True)[2][1:] @ null  # (k - 1) x B
        mix = torch.linalg.lstsq(columns.T, inside.T).solution.abs().amax(dim=1)
        uncertain = columns[mix > _INVOLVED * mix.max()]
    null = (along @ null)[None]
    q = canonical_sign(null)[0]
    # Round-off in the found columns or the inputs could move a row across: the column's zeros
    # must be its sample's inactive neurons exactly.
    if not bool((zero_mask(left, q[None], rule)[0] == inactive).all()):
        return None
    return LastColumn(q, pinned=not uncertain.shape[0], uncertain=uncertain)
