"""The last two missing columns from the other B - 2 and the bias gradient: one scan of a line.

With B - 2 columns found, the two missing samples' input coordinates lie in the plane C
orthogonal to every found column (P Q = I). Scaled as in :mod:`attacks.spearpp.last_column`
(c . L^T dL/db = 1), both inputs lie on one line of input space, x(t) = (c0 + t d) R, and
their pre-activations on the line z(t) = W x(t) + b, linear in t. Between the values of t at
which some z_j changes sign the inactive set I(t) is constant; on the segment that holds a
missing sample's input it is that sample's zero set, whose rows leave its column as their only
null direction (where the zeros pin it). On any other segment some neuron the sample has active
counts as inactive, and its row closes the null space. The segments' Gram matrices follow from
one another by one row each, so one batched Cholesky test screens them all.

A null direction is a column only where it is the segment's only one and lies outside the found
columns' span, and even then a neighbouring segment's can be a mix of the sample's column and
found ones, pinned by its extra row. So the other column follows from it in closed form
(:func:`attacks.spearpp.last_column.last_column`), and with both the sample's own input, whose
inactive neurons must be exactly the column's zeros; a mix's are not. Where the other sample's
zeros do not pin its column, this one's input is not fixed either (the other's column is known
only up to this one), so the null directions are handed back as candidates for the certificate,
which vouches for a column by its zeros alone.

The search's hardest samples are the last ones: dense ones beside very sparse found samples,
and ones zero wherever a found sample is but on a row or two. Neither makes this scan harder.
Like the last column's closed form it needs exact zeros (float64, no noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attacks.spearpp.last_column import _NULL_SHARE, _TINY_SCALE, last_column
from attacks.spearpp.refine import canonical_sign
from attacks.spearpp.zero_rule import ZeroRule, zero_mask

# A segment whose Gram matrix has an eigenvalue below this share of its mean one is screened in
# (generous: the Gram squares round-off; each one screened in is checked on its rows).
_SCREEN = 1e-8
# Screened segments checked on their rows, those nearest singular first.
_CHECKED = 32
# A null direction whose part in the plane is this small is a mix of found columns.
_ALONG = 1e-6
# Gram matrices built and screened at once: elements per chunk.
_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class PairScan:
    """What the scan settled.

    Attributes
    ----------
    columns
        k x B (k at most 2): missing columns, each checked against its sample's input.
    candidates
        Null directions of segments not checked that way, for the certificate.
    """

    columns: torch.Tensor
    candidates: torch.Tensor


def _screened(
    left: torch.Tensor, start: torch.Tensor, rows: torch.Tensor, signs: torch.Tensor
) -> torch.Tensor:
    """The segments whose Gram matrix is nearly singular, nearest first.

    Segment 0 holds the ``start`` rows of ``left``; segment k adds ``signs[k - 1]`` times the
    outer product of row ``rows[k - 1]`` to segment k - 1's Gram matrix.
    """
    b = left.shape[1]
    eye = torch.eye(b, dtype=left.dtype, device=left.device)
    total = left[start].T @ left[start]
    steps = torch.cat([rows.new_full((1,), -1), rows])
    hits: list[torch.Tensor] = []
    shares: list[torch.Tensor] = []
    chunk = max(1, _CHUNK_ELEMENTS // (b * b))
    for offset in range(0, steps.shape[0], chunk):
        block = steps[offset : offset + chunk]
        moving = torch.nonzero(block >= 0).flatten()
        vec = left.new_zeros(block.shape[0], b)
        vec[moving] = left[block[moving]]
        weight = left.new_zeros(block.shape[0])
        weight[moving] = signs[offset + moving - 1]
        grams = total + torch.cumsum(weight[:, None, None] * vec[:, :, None] * vec[:, None, :], 0)
        total = grams[-1]
        scale = grams.diagonal(dim1=1, dim2=2).sum(dim=1) / b
        # A Cholesky factorisation of G - tau I fails exactly where G has an eigenvalue below
        # tau: cheaper than the eigenvalues, which only the few screened in need.
        info = torch.linalg.cholesky_ex(grams - (_SCREEN * scale)[:, None, None] * eye).info
        near = torch.nonzero((info > 0) & (scale > 0)).flatten()
        if near.numel():
            hits.append(near + offset)
            shares.append(torch.linalg.eigvalsh(grams[near])[:, 0] / scale[near])
    if not hits:
        return rows.new_zeros(0)
    return torch.cat(hits)[torch.cat(shares).argsort()]


def last_pair(
    columns: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    grad_bias: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    rule: ZeroRule,
) -> PairScan:
    """The missing columns (engine coordinates) the scan settles, and its other candidates.

    Parameters
    ----------
    columns
        The B - 2 found columns (unit rows); with any other number nothing is returned.
    left, right
        The factors of the gradient, L (m x B, orthonormal columns) and R (B x n).
    grad_bias
        The layer's bias gradient (m).
    weight, bias
        The layer's weight (m x n) and bias (m).
    rule
        The zero rule the columns were found under.
    """
    b = left.shape[1]
    none = PairScan(left.new_zeros(0, b), left.new_zeros(0, b))
    if columns.shape[0] != b - 2 or b < 2:
        return none
    plane = torch.linalg.svd(columns.T, full_matrices=True)[0][:, b - 2 :]  # B x 2
    target = left.T @ grad_bias
    s = plane.T @ target
    if bool(s.norm() <= _TINY_SCALE * target.norm()):
        return none
    origin = plane @ s / (s @ s)  # origin . target = 1
    along = plane @ torch.stack([-s[1], s[0]]) / s.norm()  # along . target = 0
    z0 = weight @ (origin @ right) + bias
    dz = weight @ (along @ right)
    moving = torch.nonzero(dz != 0).flatten()
    cuts = -z0[moving] / dz[moving]
    order = cuts.argsort()
    cuts, rows = cuts[order], moving[order]
    # Far down the line a neuron is inactive where dz > 0; past its cut it turns active (and
    # one with dz < 0 inactive).
    start = torch.nonzero((dz > 0) | ((dz == 0) & (z0 <= 0))).flatten()
    signs = torch.where(dz[rows] < 0, 1.0, -1.0).to(left.dtype)
    screened = _screened(left, start, rows, signs)
    edges = torch.cat([cuts[:1] - 1, cuts, cuts[-1:] + 1])
    mids = (edges[:-1] + edges[1:]) / 2
    tried: list[torch.Tensor] = []
    for k in screened[:_CHECKED].tolist():
        inactive = z0 + mids[k] * dz <= 0
        if int(inactive.sum()) < b - 1:
            continue
        # All B right singular vectors, without the left factor a full SVD of these ~m / 2 rows
        # would build (see last_column).
        _, singular, vh = torch.linalg.svd(
            left[inactive], full_matrices=int(inactive.sum()) < left.shape[1]
        )
        null = vh[int((singular > _NULL_SHARE * singular[0]).sum()) :]
        if null.shape[0] != 1 or bool((plane.T @ null[0]).norm() < _ALONG):
            continue  # closed, or not pinned, or a mix of found columns
        q = canonical_sign(null)[0]
        if any(float((q @ t).abs()) > 1 - 1e-9 for t in tried):
            continue  # segments inside a sample's zero set all give its column
        tried.append(q)
        other = last_column(
            torch.cat([columns, q[None]]), left, right, grad_bias, weight, bias, rule
        )
        if other is None:
            continue
        v = plane.T @ other.column
        dual = plane @ torch.stack([-v[1], v[0]])  # in the plane, orthogonal to the other column
        scale = dual @ target
        if bool(scale.abs() <= _TINY_SCALE * target.norm()):
            continue
        own = weight @ (dual @ right / scale) + bias <= 0
        if not bool((own == zero_mask(left, q[None], rule)[0]).all()):
            continue
        pair = torch.stack([q, other.column]) if other.pinned else q[None]
        return PairScan(pair, none.candidates)
    return PairScan(none.columns, torch.stack(tried) if tried else none.candidates)
