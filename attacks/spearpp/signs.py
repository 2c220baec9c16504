"""Sign-consistency search: the layer's own weights tie each column's zeros to a halfspace pattern.

Sample i leaves neuron j inactive exactly when w_j . x_i + b_j < 0, and its input lies in the
gradient's row space: x_i = p_i V^T with V the right singular vectors. So the zero set of column
i of L Q is the negative set of A p_i (+ b), A = W V: a pattern the server can compute for any p.
The search alternates two views of one sample (working with L = U S, for which P Q = I):

- labels: the rows where |L q| is below its median are labelled inactive, and p is their least-
  squares fit in col(A); projecting m labels onto a B-dimensional subspace removes most of their
  errors, so the fitted pattern is closer to one sample's than the labels were;
- null step: on the rows where A p is most negative, q becomes the robust null direction of L
  (least squares, then IRLS towards l1).

A true column is a fixed point; a mix of columns is not (its zero set, an intersection of
halfspace patterns, is not one), so from random starts the iteration lands on columns. Its basins
are uneven, so found columns are deflated in both views, since P Q = I:

- inputs: every unfound sample's coordinates are exactly orthogonal to every found column, so the
  halfspace fit is restricted to their complement. This alone leaves a found sample whose p_k
  lies mostly in that complement reachable; with few columns missing it is decisive (two
  similar columns, e.g. same-label samples of a depth-2 network, whose mixes are nearly as
  sparse as they are, were found only this way);
- columns: every unfound column is orthogonal to the found samples' input coordinates p_k,
  estimated as the max-margin fit to column k's exact zero pattern, kept orthogonal to the other
  found columns; the null step searches the complement of those estimates, the last iterations
  run without it, so the estimates' errors do not stay in the result.

Every fit is affine, A p + t b with t free: a column's scale, and so that of p, is unknown, and
the bias cannot be left out where it is not small next to W x (a server that shifts the biases
so that each neuron fires for a tenth of the samples: SPEAR++ found 24 of 64 columns in 60 s
with linear fits, where it finds all 64 of the honest layer in 5 s). Under noise the engine
keeps them linear (see ``SignGeometry.build``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attacks.spearpp.refine import zero_split

# Rows handed to the null step: at least this many per column of Q.
_ROWS_PER_COLUMN = 3
IRLS_STEPS = 3
# Final iterations whose labels split at each point's jump (the earlier ones at the median).
JUMP_ITERATIONS = 4
# Final iterations without deflation. The found samples' input estimates are degrees off when
# m / B is small (max-margin fits of B + 1 coordinates to m signs), so the complement they leave
# misses the unfound columns by as much; points need these iterations to reach them (with
# exact inputs, deflation finds every column either way). `fl-sim bench reach` measures it.
FREE_ITERATIONS = 4
# IRLS weights are capped where |L q| falls below this share of its largest entry.
_IRLS_FLOOR = 1e-6
# Inverse iteration of the null step: solves, shift relative to the mean eigenvalue, and the
# share of the all-ones direction mixed into the start.
_INVERSE_SOLVES = 8
_INVERSE_SHIFT = 1e-9
_INVERSE_SEED = 1e-6
MARGIN_NEWTON_STEPS = 8
_LINE_SEARCH_SIZES = 4
_MARGIN_RIDGE = 1e-6
# Elements of rows gathered at once: the max-margin Hessians (see _hinge_hessian) and the
# complement's null steps (see complement.complement_columns).
GATHER_ELEMENTS = 1 << 24
# Elements of the B x B Hessians of max-margin fits held at once (several copies live): a
# complement round's 3,000 candidates at B=512, m=4000 asked for 6.4 GB per copy.
FIT_ELEMENTS = 1 << 26
# A point leaves a deflated stage of the sign search once a null step moves it less than this
# (cosine of 0.5 degrees; see sign_search's ``drop_fixed``).
_SETTLED_COSINE = math.cos(math.radians(0.5))


@dataclass(frozen=True)
class SignGeometry:
    """The two views of the factorisation, in the search's coordinates.

    Attributes
    ----------
    left
        L = U S (m x B): columns of Q in these coordinates pair with input coordinates p by
        P Q = I.
    pre
        A = W V (m x B): the pre-activation of the input with coordinates p is A p + b.
    bias
        b (m x 1), the layer's biases, or m x 0 where the fits leave it out.
    pre_basis
        Orthonormal basis of the column space of [A, b] (m x (B + 1)): a least-squares fit in it
        is a projection.
    singular
        S, mapping these coordinates to the engine's (whose left factor is U).
    """

    left: torch.Tensor
    pre: torch.Tensor
    bias: torch.Tensor
    pre_basis: torch.Tensor
    singular: torch.Tensor

    @staticmethod
    def build(
        left: torch.Tensor, right: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> SignGeometry:
        """From the engine's factors (``left`` = U, ``right`` = S V^T) and the layer's weight
        and bias (``None``: linear fits, the bias left out)."""
        singular = right.norm(dim=1)
        pre = weight.to(right.dtype) @ (right / singular[:, None]).T
        b = pre.new_zeros(pre.shape[0], 0) if bias is None else bias.to(pre)[:, None]
        basis = torch.linalg.qr(torch.cat([pre, b], dim=1)).Q
        return SignGeometry(left * singular, pre, b, basis, singular)

    def engine_left(self) -> torch.Tensor:
        """U (m x B), the rows in the engine's coordinates, where the zero rule applies."""
        return self.left / self.singular

    def affine(self, directions: torch.Tensor | None = None) -> torch.Tensor:
        """[A D, b] (m x (c + 1)): the pre-activations of inputs in the span of ``directions``
        (B x c; all inputs when ``None``) and the bias, for affine halfspace fits ([A D] when
        the geometry leaves the bias out)."""
        pre = self.pre if directions is None else self.pre @ directions
        return torch.cat([pre, self.bias], dim=1)

    def to_search(self, columns: torch.Tensor) -> torch.Tensor:
        """Engine directions (c x B) in these coordinates, unit rows."""
        return torch.nn.functional.normalize(columns / self.singular, dim=1)

    def to_engine(self, points: torch.Tensor) -> torch.Tensor:
        """Points of this search (c x B) as engine directions, unit rows."""
        return torch.nn.functional.normalize(points * self.singular, dim=1)


def input_space(geom: SignGeometry, found: torch.Tensor | None) -> torch.Tensor:
    """Orthonormal basis (m x (B - F + 1)) of the pre-activations of inputs orthogonal to the
    found columns (F x B) and the bias; of all inputs' and the bias when none is found."""
    if found is None or not found.shape[0]:
        return geom.pre_basis
    complement = torch.linalg.svd(found.T, full_matrices=True)[0][:, found.shape[0] :]
    basis: torch.Tensor = torch.linalg.qr(geom.affine(complement)).Q
    return basis


def _inactive_rows(
    left: torch.Tensor,
    basis: torch.Tensor,
    q: torch.Tensor,
    count: int,
    whole: bool,
    at_jump: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each point (K x B), the ``count`` rows its fitted halfspace pattern (the labels'
    projection onto ``basis``) rates most inactive (K x count), and which of them the null
    step uses (K x count). With ``whole``, every row (K x m), and a point at a jump of its
    sizes uses all its zeros.

    Without ``at_jump`` the labels split at the median, or at the point's jump where that
    marks more rows inactive (sparse layers' samples leave 90% of them inactive), and every
    picked row is used: the fit corrects labels, so rows labelled active that it rates deeply
    inactive are taken too. This is what moves a point off a mix of columns, whose shared
    zeros (fewer than either column's) are exact zeros as well.

    With ``at_jump`` the labels split at each point's own jump (see ``zero_split``), and rows
    labelled active are never used: at a true column the labels are exact, so its null step
    sees only true zeros and the column stays a fixed point whatever the fit's errors, as long
    as its rows pin it (trained networks' samples leave a third to two thirds of the neurons
    inactive, so a median split mislabels them). Only in the last iterations: from the first
    one on, it made mixes fixed points too, and at B = 256, m = 4000 rounds of 8 starts found
    1 to 3 columns instead of 6 to 8. On a sparse layer the deepest ``count`` rows do not pin
    a column: with biases shifted to fire each neuron for a tenth of the samples they are
    inactive for nearly every sample, a sample active on one or two neurons is null on them
    too, and only 1 of 24 true columns (m = 300) stayed a fixed point; with all its zeros
    every one does.
    """
    size = (q @ left.T).abs()
    split, jumped = zero_split(size, q.shape[1])
    if not at_jump:
        split = torch.maximum(split, size.median(dim=1, keepdim=True).values)
    labels = torch.where(size < split, -1.0, 1.0).to(size.dtype)
    pre_act = (labels @ basis) @ basis.T
    if not at_jump:
        rows = pre_act.argsort(dim=1)[:, :count]
        return rows, torch.ones_like(rows, dtype=torch.bool)
    # Labelled-active rows go last: their fitted values are shifted past every inactive one.
    shift = 2 * pre_act.abs().amax(dim=1, keepdim=True) + 1
    rows = (pre_act + shift * (labels > 0)).argsort(dim=1)
    use = labels.gather(1, rows) < 0
    if not whole:
        return rows[:, :count], use[:, :count]
    deepest = torch.arange(rows.shape[1], device=rows.device) < count
    return rows, use & (jumped[:, None] | deepest)


def smallest_eigenvectors(gram: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Unit eigenvectors of the smallest eigenvalues of K PSD matrices (K x B x B), by inverse
    iteration from ``start`` (K x B): a few Cholesky solves of the slightly shifted matrices.

    Each solve multiplies the wanted component by lambda_2 / lambda_1 against the next one, and
    the null step's matrices of a true column have a near-zero smallest eigenvalue, so a few
    solves from the previous iterate suffice there. ``torch.linalg.eigh`` checks its error
    codes on the host after every call on CUDA; the shift keeps Cholesky from failing, so this
    needs no check and runs with no host round trip. Where the gap is small it stays nearer
    the start than the exact eigenvector does (see ``SpearConfig.null_step``).
    """
    b = gram.shape[-1]
    eye = torch.eye(b, dtype=gram.dtype, device=gram.device)
    shift = _INVERSE_SHIFT * gram.diagonal(dim1=-2, dim2=-1).sum(-1) / b
    chol = torch.linalg.cholesky_ex(gram + shift[:, None, None] * eye, check_errors=False)[0]
    # A start orthogonal to the wanted vector would stay so: a trace of every direction.
    v: torch.Tensor = torch.nn.functional.normalize(start, dim=1) + _INVERSE_SEED / b**0.5
    for _ in range(_INVERSE_SOLVES):
        v = torch.cholesky_solve(v.unsqueeze(-1), chol).squeeze(-1)
        v = torch.nn.functional.normalize(v, dim=1)
    return v


def _eigh_smallest(gram: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """The exact eigenvectors of the smallest eigenvalues (``start`` is not needed)."""
    vectors: torch.Tensor = torch.linalg.eigh(gram)[1][:, :, 0]
    return vectors


# How the null step finds the smallest eigenvector of each point's Gram matrix, by name.
NULL_STEPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "eigh": _eigh_smallest,
    "inverse": smallest_eigenvectors,
}


def _null_step(
    rows: torch.Tensor,
    q: torch.Tensor,
    smallest: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    use: torch.Tensor | None = None,
) -> torch.Tensor:
    """Robust null direction of each point's rows (K x r x c), from ``q`` (K x c): least
    squares, then IRLS steps towards the l1 minimiser. ``use`` (K x r) leaves rows out
    (weight 0)."""
    mask = torch.ones(rows.shape[:2], dtype=rows.dtype, device=rows.device)
    if use is not None:
        mask = use.to(rows.dtype)
    weights = mask
    for step in range(IRLS_STEPS):
        if step:
            size = torch.einsum("krb,kb->kr", rows, q).abs()
            largest = size.amax(dim=1, keepdim=True)
            # A point null on all its rows (a small layer's) has nothing to reweight by: 0 / 0.
            weights = torch.where(largest > 0, mask / size.clamp_min(_IRLS_FLOOR * largest), mask)
        gram = torch.einsum("krb,kr,krc->kbc", rows, weights, rows)
        q = smallest(gram, q)
    return q


def null_step_rows(m: int, b: int) -> int:
    """Default rows per null step for m neurons and B columns."""
    return min(m // 2, max(_ROWS_PER_COLUMN * b, m // 5))


def sign_search(
    geom: SignGeometry,
    starts: torch.Tensor,
    deflation: torch.Tensor | None,
    iterations: int,
    found: torch.Tensor | None = None,
    null_step: str = "eigh",
    rows: int | None = None,
    engine_rows: bool = True,
    whole: bool = False,
    free_iterations: int = FREE_ITERATIONS,
    drop_fixed: bool | None = None,
) -> torch.Tensor:
    """Iterate labels and null steps from ``starts`` (K x B, search coordinates).

    Parameters
    ----------
    geom
        The factorisation's two views.
    starts
        Unit starting directions.
    deflation
        Orthonormal basis (B x F) of the found samples' estimated input coordinates: all but the
        last iterations search its orthogonal complement. ``None`` when nothing is found yet.
    iterations
        Label/null alternations.
    found
        The found columns (F x B, search coordinates): the halfspace fits are restricted to
        their orthogonal complement, where the unfound samples' inputs lie. ``None``: no
        restriction.
    null_step
        Key of :data:`NULL_STEPS`: how each null step's eigenvector is found.
    rows
        Rows per null step (default: :func:`null_step_rows`).
    engine_rows
        Run the null steps on rows of U (the engine's coordinates) rather than of U S. Without
        noise this keeps a sample whose gradient is 1e-5 of the others' (well classified, on a
        trained network) from being a near-null direction of every row block; under noise it
        would weight the noisiest directions most, so noisy gradients keep U S.
    whole
        Points at a jump null-step on all their zeros, not ``rows`` of them: for sparse layers,
        where a few rows pin no column (see ``_inactive_rows``); it costs m / ``rows`` times
        the null steps' work.
    free_iterations
        The last iterations, run without ``deflation``.
    drop_fixed
        Let a point leave a stage of the schedule (see :func:`_stages`) once its null step's
        rows repeat (its next iterations there would repeat it: exactly with ``eigh``, to the
        inverse iteration's convergence with ``inverse``), and a
        deflated stage once a null step moves it less than half a degree. ``None``: on the CPU
        only (on a GPU, dropping points costs a host round trip per iteration).

    Returns
    -------
    torch.Tensor
        K x B points, in search coordinates.
    """
    count = rows or null_step_rows(*geom.left.shape)
    # With engine rows the null steps solve for v = S q on rows of U.
    scale = geom.singular if engine_rows else torch.ones_like(geom.singular)
    step_rows = geom.left / scale
    complement = None
    if deflation is not None and deflation.shape[1]:
        full = torch.linalg.svd(deflation, full_matrices=True)[0]
        complement = torch.linalg.qr(scale[:, None] * full[:, deflation.shape[1] :]).Q
        # Deflated null steps work in the complement's coordinates: rows projected once, not
        # each point's B x B Gram matrix projected at every IRLS step (B=256, m=4000: 17 of the
        # null steps' 22 s went to deflated stages).
        deflated_rows = step_rows @ complement
    fit_space = input_space(geom, found)
    smallest = NULL_STEPS[null_step]
    q = starts.to(device=geom.left.device, dtype=geom.left.dtype).clone()
    if drop_fixed is None:
        drop_fixed = q.device.type == "cpu"
    for length, deflated, at_jump in _stages(iterations, free_iterations, whole):
        deflate = complement if deflated else None
        live = torch.arange(q.shape[0], device=q.device)
        last: tuple[torch.Tensor, torch.Tensor] | None = None
        for _ in range(length):
            picked, use = _inactive_rows(geom.left, fit_space, q[live], count, whole, at_jump)
            # In index order: the same rows give the same Gram matrix, bit for bit.
            picked, order = picked.sort(dim=1)
            use = use.gather(1, order)
            if drop_fixed and last is not None:
                moved = ~((picked == last[0]).all(dim=1) & (use == last[1]).all(dim=1))
                live, picked, use = live[moved], picked[moved], use[moved]
                if not live.numel():
                    break
            before = torch.nn.functional.normalize(q[live] * scale, dim=1)
            if deflate is None:
                v = _null_step(step_rows[picked], before, smallest, use)
            else:
                v = _null_step(deflated_rows[picked], before @ deflate, smallest, use) @ deflate.T
            q[live] = torch.nn.functional.normalize(v / scale, dim=1)
            last = (picked, use)
            if drop_fixed and deflate is not None:
                # The deflated stages' fixed points are only as close to a column as the
                # found inputs' estimates allow (degrees): smaller moves are the deepest rows'
                # edge trading places (0.05 to 0.4 degrees per iteration at B=100, m=4000).
                going = (before * v).sum(dim=1).abs() < _SETTLED_COSINE
                live, last = live[going], (picked[going], use[going])
                if not live.numel():
                    break
    return q


def _stages(iterations: int, free_iterations: int, whole: bool) -> list[tuple[int, bool, bool]]:
    """The sign search's schedule as runs of like iterations: (length, deflated, at_jump).

    Within a run each iteration maps the point's null-step rows to the next ones by the same
    rule, so a point whose rows repeat stays where it is for the rest of the run (measured at
    B=100, m=4000: the first null step lands within 2 to 4 degrees of the deflated fixed point,
    the second on it, then 8 iterations repeat it; the first free one reaches the column).
    """
    stages: list[tuple[int, bool, bool]] = []
    for it in range(iterations):
        kind = (it < iterations - free_iterations, whole or it >= iterations - JUMP_ITERATIONS)
        if stages and stages[-1][1:] == kind:
            stages[-1] = (stages[-1][0] + 1, *kind)
        else:
            stages.append((1, *kind))
    return stages


def fit_inputs(pre: torch.Tensor, active: torch.Tensor, gather: bool | None = None) -> torch.Tensor:
    """Max-margin input coordinates for activity patterns, :data:`FIT_ELEMENTS` at a time.

    Minimises sum_j max(0, 1 - s_j a_j . p)^2 + ridge |p|^2 (s_j = +1 on active rows, -1 on
    inactive ones) by Newton steps with backtracking, from the least-squares fit.

    Parameters
    ----------
    pre
        A (m x B).
    active
        c x m boolean patterns.
    gather
        Build each Hessian from the rows with slack only (see :func:`_hinge_hessian`).
        ``None``: on the CPU only (counting them is a host round trip on a GPU).

    Returns
    -------
    torch.Tensor
        c x B coordinates, one row per pattern.
    """
    if not active.shape[0]:
        return pre.new_zeros(0, pre.shape[1])
    # Each fit is its own (its start, Newton steps and step sizes): chunks change nothing.
    chunk = max(1, FIT_ELEMENTS // pre.shape[1] ** 2)
    return torch.cat([_fit_some(pre, part, gather) for part in active.split(chunk)])


def _fit_some(pre: torch.Tensor, active: torch.Tensor, gather: bool | None) -> torch.Tensor:
    """:func:`fit_inputs` of all of ``active``'s patterns at once."""
    sign = torch.where(active, 1.0, -1.0).to(pre.dtype).T  # m x c
    eye = torch.eye(pre.shape[1], dtype=pre.dtype, device=pre.device)
    # A^T A starts the fits (least squares by the normal equations) and the first Hessian.
    gram = pre.T @ pre
    ridged = torch.linalg.cholesky_ex(gram + _MARGIN_RIDGE * eye, check_errors=False)[0]
    p = torch.cholesky_solve(pre.T @ sign, ridged)

    # Backtracking without host round trips: every step size is tried at once, the largest
    # that meets Armijo's condition kept, none where none does (the loss never rises). The full
    # Newton step is nearly always taken: 4 sizes gave the same fits as 20 on every call of
    # a B=100, m=4000 attack, and the fits took a third less time.
    sizes = 0.5 ** torch.arange(_LINE_SEARCH_SIZES, dtype=pre.dtype, device=pre.device)
    if gather is None:
        gather = pre.device.type == "cpu"
    hess_half: torch.Tensor | None = None
    was_on = sign  # the rows with slack at the previous step (set at the first)
    h = sizes[:, None, None]
    # 1 - sign * A p, kept up to date through the steps (A step is needed for the line search).
    raw = 1 - (pre @ p) * sign
    for _ in range(MARGIN_NEWTON_STEPS):
        slack = raw.clamp_min(0)
        grad = -2 * pre.T @ (sign * slack) + 2 * _MARGIN_RIDGE * p
        on = (slack > 0).to(pre.dtype)
        if gather and hess_half is not None:
            # Between Newton steps few rows gain or lose slack (a fifth to a third of those
            # with slack, at B=100, m=4000): the Hessian follows by their outer products.
            hess_half = hess_half + _hinge_hessian(pre, on - was_on, gather)
        elif gather:
            # At the least-squares start most rows have slack (3,100 of 4,000 at B=256,
            # m=4000): A^T A less the others' products is the cheaper sum.
            hess_half = gram - _hinge_hessian(pre, 1 - on, gather)
        else:
            hess_half = _hinge_hessian(pre, on, gather)
        was_on, hess = on, 2 * hess_half
        # The ridge makes every Hessian positive definite: no error check (a host sync) needed.
        chol = torch.linalg.cholesky_ex(hess + 2 * _MARGIN_RIDGE * eye, check_errors=False)[0]
        step = torch.cholesky_solve(grad.T.unsqueeze(-1), chol).squeeze(-1).T
        # The slack at p - h step is max(0, raw + h sign * A step): one product for all h.
        before = slack.square().sum(0) + _MARGIN_RIDGE * p.square().sum(0)
        rate = sign * (pre @ step)
        after = (raw + h * rate).clamp_min(0).square().sum(1)
        after = after + _MARGIN_RIDGE * (p - h * step).square().sum(1)  # sizes x c
        slope = (grad * step).sum(0)
        ok = after <= before - 1e-4 * sizes[:, None] * slope
        first = ok.to(torch.int8).argmax(0)
        taken = torch.where(ok.any(0), sizes[first], torch.zeros_like(slope))
        p = p - taken * step
        raw = raw + taken * rate
    fitted: torch.Tensor = p.T
    return fitted


def _hinge_hessian(pre: torch.Tensor, weights: torch.Tensor, gather: bool) -> torch.Tensor:
    """A^T diag(w_c) A for each pattern c (c x B x B), ``weights`` (m x c).

    With ``gather`` only the rows of nonzero weight enter the products: near the optimum a few
    percent of them have slack (3% at B=100, m=4000, where the product over all m rows was
    most of the fits' time).
    """
    if not gather:
        return torch.einsum("jb,jc,jd->cbd", pre, weights, pre)
    count = max(1, int((weights != 0).sum(dim=0).max()))
    rows = weights.abs().topk(count, dim=0).indices  # count x c: every row that counts first
    # The gathered rows in chunks of patterns: all at once they took 23 GB where a complement
    # round fitted 2,000 candidates at B=400, m=4000 (killed by the out-of-memory killer).
    chunk = max(1, GATHER_ELEMENTS // (count * pre.shape[1]))
    parts = []
    for start in range(0, rows.shape[1], chunk):
        some = rows[:, start : start + chunk]
        picked = pre[some]  # count x chunk x B
        w = weights[:, start : start + chunk].gather(0, some)
        parts.append(torch.einsum("jcb,jc,jcd->cbd", picked, w, picked))
    return torch.cat(parts)


def halfspace_agreement(pre: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Share of rows where each pattern (c x m) agrees with its max-margin halfspace fit.

    A true column's activity pattern is a halfspace pattern (1 up to noise, with the bias among
    ``pre``'s columns); a mix's, an intersection of several, is not.
    """
    fitted = fit_inputs(pre, active) @ pre.T > 0
    return (fitted == active).to(pre.dtype).mean(dim=1)


def consistent_inputs(columns: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Estimates ``inputs`` (F x B) of the found columns' (F x B, search coordinates) input
    coordinates, made consistent.

    Each estimate p_k is replaced by its projection onto {p : p . q_i = 0 for every other found
    column i}, a constraint the true p_k meets exactly (P Q = I): that space is the complement of
    all found columns plus the dual direction of q_k within their span.
    """
    g = columns.T  # B x F
    dual = torch.linalg.pinv(g).T  # B x F, dual[:, k] . q_i = [i == k]
    full = torch.linalg.svd(g, full_matrices=True)[0]
    outside = full[:, g.shape[1] :]
    p = inputs.T
    along = (dual * p).sum(0) / dual.square().sum(0)
    consistent: torch.Tensor = (outside @ (outside.T @ p) + dual * along).T
    return consistent


def deflation_basis(columns: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis (B x F) of the found samples' input coordinates, made consistent (see
    :func:`consistent_inputs`)."""
    basis: torch.Tensor = torch.linalg.qr(consistent_inputs(columns, inputs).T).Q
    return basis
