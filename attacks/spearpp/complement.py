"""The last few columns from the inputs they must have.

With F columns of Q found, P Q = I puts every missing sample's input coordinates in the
orthogonal complement of the found columns (search coordinates), an exact M = B - F
dimensional space. A direction p there near a missing sample's input makes its pre-activation
A p most negative on neurons that sample leaves inactive: the null direction of those rows is
its column. For small M a few thousand directions cover the complement, and no estimate of the
found samples' inputs is needed.

This finds columns the sign search cannot reach: on trained networks well-classified samples
have gradients 1e-4 to 1e-6 of the others', and their basins in the search's coordinates are
narrower than a degree (the quickstart's FedSGD client after 75 to 100 rounds, where the search
stalled at 14 to 19 of 20 columns).
"""

from __future__ import annotations

import torch

from attacks.spearpp import signs
from attacks.spearpp.refine import pin_rows
from attacks.spearpp.signs import (
    MARGIN_NEWTON_STEPS,
    NULL_STEPS,
    SignGeometry,
    halfspace_agreement,
    null_step_rows,
)
from attacks.spearpp.zero_rule import ZeroRule, zero_mask

# Directions tried per dimension of the complement (two, +-p, when one column is missing),
# within a budget of work per call (multiply-adds of the null steps' Gram matrices and of the
# halfspace fits' Hessians); at least two per dimension, as long as they cost no more than
# _WORK_MAX. Sparse layers need the two (B=64, m=1000, neurons firing for a tenth of the
# samples: 10 and 12 of 56 missing columns back from 112 directions on 2 seeds, where the
# budget affords 25); at B=512, m=4000 with 505 missing they cost 2.5e10 each (the fits'
# Hessians are M^2 m), and a round of 1,010 ran past 15 minutes for no column: random
# directions of so many dimensions are near no sample's input (m=1000, B=150 at
# initialisation: none of 8 to 128 missing back, 2 seeds).
_DIRECTIONS_PER_DIM = 200
_WORK_BUDGET = 2e9
_WORK_MAX = 50 * _WORK_BUDGET
# Candidates kept per dimension of the complement, the best distinct ones: refining every
# candidate would cost more than finding them.
_KEPT_PER_DIM = 4
_KEPT_MIN = 8
# Singular values of the found columns' image on a point's rows below this share of the largest
# are round-off: those columns are zero there.
_FOUND_NULL = 1e-9
# Directions this close are the same column.
_SAME_COSINE = 1 - 1e-6


def _gram(rows: torch.Tensor) -> torch.Tensor:
    gram: torch.Tensor = rows.transpose(1, 2) @ rows
    return gram


def complement_rows(found: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis (B x (B - F)) of the orthogonal complement of ``found`` (F x B)."""
    basis: torch.Tensor = torch.linalg.svd(found.T, full_matrices=True)[0][:, found.shape[0] :]
    return basis


def _null_modulo(rows: torch.Tensor, found: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
    """For each point's rows (K x r x B), the unit v minimising |rows v| among directions whose
    part outside span(``found``) has unit length (``outside`` its orthonormal complement).

    Writing v = C c + F^T a, the best a for each c is a least-squares fit, so c is the smallest
    right singular vector of C's image with F's image projected out. A plain null step would
    return a found column (or a mix of found ones) wherever the rows are all their zeros.
    """
    image = rows @ outside  # K x r x M
    found_image = rows @ found.T  # K x r x F
    # Found columns null on the rows (their zeros) are left out of the fit, not blown up.
    pinv = torch.linalg.pinv(found_image, rtol=_FOUND_NULL)  # K x F x r
    residual = image - found_image @ (pinv @ image)
    c = torch.linalg.svd(residual, full_matrices=False)[2][:, -1, :]  # K x M
    a = -(pinv @ (image @ c[:, :, None])).squeeze(-1)  # K x F
    v = c @ outside.T + a @ found
    return torch.nn.functional.normalize(v, dim=1)


def complement_columns(
    geom: SignGeometry,
    found: torch.Tensor,
    rule: ZeroRule,
    generator: torch.Generator,
    null_step: str,
    engine_rows: bool,
) -> torch.Tensor:
    """Candidate missing columns (engine coordinates, unit rows) from the complement of the
    ``found`` ones (F x B, search coordinates), sparsest first.

    Parameters
    ----------
    geom
        The factorisation's two views.
    found
        The found columns, search coordinates.
    rule
        When an entry of U q counts as zero (the candidates are ranked by their zeros).
    generator
        Draws the directions in the complement.
    null_step
        Key of :data:`attacks.spearpp.signs.NULL_STEPS`.
    engine_rows
        Null steps on rows of U (no noise) rather than U S (see
        :func:`attacks.spearpp.signs.sign_search`).

    Returns
    -------
    torch.Tensor
        Up to max(8, 4 M) distinct candidates, none a found column, sparsest first, for the
        harvester to refine and certify.
    """
    m, b = geom.left.shape
    complement = complement_rows(found)
    dim = complement.shape[1]
    if not dim:
        return found.new_zeros(0, b)
    counts = sorted({min(k, m) for k in (pin_rows(b), 2 * b, null_step_rows(m, b))})
    if dim == 1:
        mixes = torch.tensor([[1.0], [-1.0]], dtype=found.dtype)
    else:
        # Per direction: a null step per row count, and the halfspace fit of each result (a
        # Newton step costs m (M + 1)^2; with many columns missing the fits are most of it).
        fits = 0 if rule.noise_std else len(counts) * MARGIN_NEWTON_STEPS * m * (dim + 1) ** 2
        per_direction = sum(counts) * b * b + fits
        floor = max(1, min(2 * dim, int(_WORK_MAX / per_direction)))
        many = max(floor, min(_DIRECTIONS_PER_DIM * dim, int(_WORK_BUDGET / per_direction)))
        draws = torch.randn(many, dim, generator=generator, dtype=found.dtype)
        mixes = torch.nn.functional.normalize(draws, dim=1)
    directions = mixes.to(found.device) @ complement.T
    # Pre-activations of each direction, the bias left out: its deepest rows are inactive for
    # the missing sample whose input it is near.
    order = (directions @ geom.pre.T).argsort(dim=1)
    scale = geom.singular if engine_rows else torch.ones_like(geom.singular)
    rows = geom.left / scale
    # On trained networks a direction's deepest rows are mostly zeros of found samples too (a
    # sample active on 40 of 200 neurons is zero on nearly every row), so null steps solve
    # modulo the found columns; under noise (exact zeros do not exist) as before, which kept
    # DP sigma=1e-4 above 90% near-exact.
    modulo = bool(found.shape[0]) and not rule.noise_std
    found_rows = geom.to_engine(found) if engine_rows else found
    outside = complement_rows(found_rows) if modulo else found_rows
    start = torch.nn.functional.normalize(torch.ones_like(directions), dim=1)
    smallest = NULL_STEPS[null_step]
    solved = []
    for k in counts:
        # A chunk of directions at a time: their rows are gathered (K x k x B, and as large
        # again in _null_modulo's images); at B=512, m=4000 all at once asked for 4.3 GB each.
        chunk = max(1, signs.GATHER_ELEMENTS // (k * b))
        for begin in range(0, order.shape[0], chunk):
            # One null step, no reweighting: a direction near a sample's input picks its true
            # zeros.
            picked = rows[order[begin : begin + chunk, :k]]
            if modulo:
                solved.append(_null_modulo(picked, found_rows, outside))
            else:
                solved.append(smallest(_gram(picked), start[begin : begin + chunk]))
    solved_all = torch.cat(solved)
    # On rows of U the null direction is S q, an engine direction already.
    points = torch.nn.functional.normalize(solved_all * (1 if engine_rows else scale), dim=1)
    engine_left = geom.engine_left()
    # A missing sample's input lies in the complement, so its column's activity pattern is a
    # halfspace pattern there (an affine one: the bias is a column of the fit); a mix's, an
    # intersection of several, is not. The mixes of sparse samples have far more zeros than a
    # dense sample's column (measured on the quickstart's FedSGD client after 29 CIFAR-10
    # rounds: 100 against 34), so candidates are ranked by that agreement first and by their
    # zeros only among equals.
    zero = zero_mask(engine_left, points, rule)
    zeros = zero.sum(dim=1).to(points.dtype)
    # Directions that land on the same column are fitted once, on its sparsest copy (the fits
    # are the costly part: 54 of 66 s on a sparsified m=1000 layer with 48 columns missing).
    order = zeros.argsort(descending=True)
    points, zero, zeros = points[order], zero[order], zeros[order]
    same = ((points @ points.T).abs() > _SAME_COSINE).triu(diagonal=1)
    distinct = ~same.any(dim=0)
    points, zero, zeros = points[distinct], zero[distinct], zeros[distinct]
    if not rule.noise_std:
        agree = halfspace_agreement(geom.affine(complement), ~zero)
        zeros = torch.round(agree * m) * (m + 1) + zeros
    known = torch.zeros(len(points), dtype=torch.bool, device=points.device)
    if len(found):  # with none found yet (a sign round that found nothing) none is known
        known = (points @ geom.to_engine(found).T).abs().amax(dim=1) > _SAME_COSINE
    score = zeros.masked_fill(known, -torch.inf)
    # The same column comes back from many directions: take the best, drop its copies, and
    # again.
    kept = []
    for _ in range(max(_KEPT_MIN, _KEPT_PER_DIM * dim)):
        best = score.argmax()
        if score[best] == -torch.inf:
            break  # every point left is a copy (each would cost its refinement for nothing)
        kept.append(points[best])
        score = score.masked_fill((points @ points[best]).abs() > _SAME_COSINE, -torch.inf)
    return torch.stack(kept) if kept else points[:0]
