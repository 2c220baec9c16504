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
the f's exact (their dual rows are orthogonal to v). A one-step update's next layer fixes the
f's too (:func:`settle_uncertain`). The closed form needs exact zeros: at float32's round-off
(singular values far above ``_NULL_SHARE``) it settles nothing. Under noise, or at that
round-off, :func:`noisy_last_column` proposes the column for the noise-level certificate
instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attacks.spearpp.inputs import LayerObservation
from attacks.spearpp.refine import canonical_sign
from attacks.spearpp.zero_rule import ZeroRule, zero_mask

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


def _inactive_of_missing(
    columns: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    grad_bias: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The unit vector c orthogonal to the B - 1 found ``columns`` and the missing sample's
    inactive neurons {j : W_j x_m + b_j <= 0}, x_m = c R / (c . L^T dL/db); ``None`` where the
    scale is unknown or the neurons are too few to pin a column."""
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
    return c, inactive


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
    found = _inactive_of_missing(columns, left, right, grad_bias, weight, bias)
    if found is None:
        return None
    c, inactive = found
    # All B right singular vectors, without the left factor a full SVD of these ~m / 2 rows
    # would build (0.44 s of 0.45 at B=100, m=4000).
    _, singular, vh = torch.linalg.svd(
        left[inactive], full_matrices=int(inactive.sum()) < left.shape[1]
    )
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


def noisy_last_column(
    columns: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    grad_bias: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Under noise: the missing column's candidate and its sample's predicted inactive neurons.

    The same closed form as :func:`last_column`, with the null direction taken as the smallest
    right singular vector of the inactive neurons' rows of L, which noise leaves only nearly
    null. The caller certifies it at the noise level and checks its zeros against the
    predicted neurons: a direction the B - 1 found columns and the bias gradient predict
    needs no halfspace fit, whose squared-hinge compromise a single zero pushed just past the
    noise tolerance can drag below the mixes' scores (SecAgg+, B=8, m=100: the true last
    column scored 0.88, under the 0.92 that mixes must not reach).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor] | None
        The candidate (B, unit, engine coordinates) and the inactive mask (m); ``None`` where
        :func:`last_column`'s closed form has no answer.
    """
    found = _inactive_of_missing(columns, left, right, grad_bias, weight, bias)
    if found is None:
        return None
    _, inactive = found
    q = torch.linalg.svd(left[inactive], full_matrices=False)[2][-1]
    return canonical_sign(q[None])[0], inactive


# A hidden vector whose part outside the next layer's row space is this far below its norm
# (relative to the gradient's round-off) lies in it.
_IN_ROW_SPACE = 10.0
# |mu| at or below this is the last sample's own input.
_NOT_ANCHOR = 1e-6
# Breakpoint segments solved at once.
_SEGMENT_CHUNK = 64


def _on_row_space(
    anchor: torch.Tensor, toward: torch.Tensor, basis: torch.Tensor, tol: float
) -> torch.Tensor | None:
    """The mu at which relu(anchor + mu toward) lies in span(``basis``) (m x B, orthonormal),
    other than where it is ``anchor``'s own; ``None`` unless exactly one mu does.

    relu(anchor + mu toward) is linear in mu between the mu where an entry changes sign, so
    on each such segment the condition is one least-squares equation in mu.
    """
    moving = toward != 0
    cuts = (-anchor[moving] / toward[moving]).sort().values
    edges = torch.cat([cuts[:1] - 1, cuts, cuts[-1:] + 1])
    found: list[torch.Tensor] = []
    for lo, hi in zip(
        edges[:-1].split(_SEGMENT_CHUNK), edges[1:].split(_SEGMENT_CHUNK), strict=True
    ):
        mid = (lo + hi) / 2
        active = (anchor + mid[:, None] * toward > 0).to(anchor.dtype)  # s x m
        a, d = active * anchor, active * toward
        a_out = a - (a @ basis) @ basis.T
        d_out = d - (d @ basis) @ basis.T
        mu = -(a_out * d_out).sum(dim=1) / (d_out * d_out).sum(dim=1).clamp_min(1e-300)
        hidden = a + mu[:, None] * d
        residual = (a_out + mu[:, None] * d_out).norm(dim=1)
        # (Where no neuron is active the hidden vector is 0, in every row space.)
        live = active.any(dim=1)
        flat = live & (d_out.norm(dim=1) <= tol * d.norm(dim=1))
        if bool((flat & (a_out.norm(dim=1) <= tol * a.norm(dim=1))).any()):
            return None  # a whole segment lies in the row space: no single mu
        ok = live & ~flat & (mu >= lo) & (mu <= hi) & (residual <= tol * hidden.norm(dim=1))
        # mu = 0 is the last sample's own hidden vector.
        found.extend(mu[ok & (mu.abs() > _NOT_ANCHOR)])
    if len(found) != 1:
        return None
    return found[0]


def settle_uncertain(
    inputs: torch.Tensor,
    uncertain: torch.Tensor,
    last: int,
    obs: LayerObservation,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The uncertain samples' inputs fixed by the next layer's gradient, where it is given.

    Each uncertain reconstruction lies on the line through its true input and the last
    sample's (exact) input: the first layer's observations hold along it. The next layer's
    gradient sum_k w_k h_k^T has the hidden vectors h_k = relu(W x_k + b) as its row space, and
    of the line's points only the true input's hidden vector lies in it (and the last
    sample's own).

    Parameters
    ----------
    inputs
        B x n reconstruction.
    uncertain
        Mask (B) of the samples the first layer leaves uncertain.
    last
        Row of the last sample, whose input is exact.
    obs
        The observation, with its next layer.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        The inputs with every settled sample in place, and the mask of those settled.
    """
    settled = torch.zeros_like(uncertain)
    nxt = obs.next_layer
    if nxt is None or not bool(uncertain.any()):
        return inputs, settled
    b = inputs.shape[0]
    _, singular, vh = torch.linalg.svd(nxt.grad_weight, full_matrices=False)
    # Its row space is the hidden vectors' only where it has rank B (a next layer of fewer
    # outputs than the batch, a classifier head, holds only combinations of them).
    if singular.shape[0] < b or bool(singular[b - 1] <= _NULL_SHARE * singular[0]):
        return inputs, settled
    basis = vh[:b].T  # m x B
    anchor = obs.weight @ inputs[last] + obs.bias
    inputs = inputs.clone()
    for row in torch.nonzero(uncertain).flatten().tolist():
        toward = obs.weight @ inputs[row] + obs.bias - anchor
        mu = _on_row_space(anchor, toward, basis, _IN_ROW_SPACE * obs.precision)
        if mu is not None:
            inputs[row] = inputs[last] + mu * (inputs[row] - inputs[last])
            settled[row] = True
    return inputs, settled
