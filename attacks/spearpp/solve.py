"""Steps 5-7: choosing B columns, fixing their scale and sign, and solving for the inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attacks.spearpp.inputs import LayerObservation
from attacks.spearpp.refine import canonical_sign
from attacks.spearpp.zero_rule import ZeroRule, zero_mask

# Highest mean square, in noise variances, of a column on its sample's inactive neurons for the
# column to count as zero there (see inactive_noise).
QUIET_INACTIVE = 9.0
# Without noise, a direction vanishes on a set of rows when its entries there are within this
# many times the gradient's relative round-off.
_ROUNDOFF_FACTOR = 1e3
# A set of rows pins one direction when its second-smallest eigenvalue is this far above the
# bound the smallest must meet.
_PIN_GAP = 1e-4
# Highest share of a column's zeros on neurons its input activates (see stray_zeros).
STRAY_MAX = 0.1
# Largest error, relative to its norm, that the columns' pin slack can put into a sample's input
# (see pin_spread) for a noiseless float64 update's sample to count as exact: 100 dB is an RMS
# error of 1e-5 on the [0, 1] scale, about 2e-5 of a typical image's norm; 1e-6 keeps such a
# sample above 120 dB, the margin left for the first-order bound.
PIN_SPREAD_EXACT = 1e-6
# Scales this small (relative to the largest) mean the bias gradient does not fix the column.
_TINY_SCALE = 1e-12
# Refits of the next layer's per-sample gradients: its hidden vectors depend on the scales only
# through the layer's bias, so two or three already settle them.
_SCALE_REFITS = 4


@dataclass(frozen=True)
class Solution:
    """Inputs for one choice of columns.

    Attributes
    ----------
    inputs
        B x n reconstruction, X = Q^-1 R with Q's columns scaled by the bias gradient.
    matching
        Per sample, the sparsity matching coefficient: the Jaccard index between the zeros of
        its output gradient L q_i and its inactive neurons {j : W_j x_i + b_j <= 0}. 1 for an
        exact reconstruction.
    """

    inputs: torch.Tensor
    matching: torch.Tensor

    @property
    def score(self) -> float:
        """Total matching, the quantity the greedy selection raises."""
        return float(self.matching.sum())


def _lstsq(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    solution: torch.Tensor = torch.linalg.lstsq(system, rhs[:, None]).solution
    return solution.flatten()


def _usable(scales: torch.Tensor) -> torch.Tensor:
    """Scales the fit could not fix (tiny against the largest) replaced by 1."""
    tiny = _TINY_SCALE * scales.abs().max().clamp_min(torch.finfo(scales.dtype).tiny)
    return torch.where(scales.abs() < tiny, torch.ones_like(scales), scales)


def next_layer_scales(
    q_hat: torch.Tensor,
    target: torch.Tensor,
    mixed_inputs: torch.Tensor,
    scales: torch.Tensor,
    obs: LayerObservation,
    weight: float,
) -> torch.Tensor:
    """Refit the column scales d to the bias gradients of this layer and the next together,
    the next layer's equations weighted by ``weight`` (see :mod:`attacks.spearpp.next_noise`).

    Sample i's input is x_i = r_i / d_i (r_i the i-th row of ``mixed_inputs``), so its hidden
    vector h_i = relu(W x_i + b) is known given d. The next layer's gradient is
    G' = sum_i w_i h_i^T and its bias gradient sum_i w_i; h_i scales nearly as 1 / d_i (all
    but the bias), so the w_i that G' H^+ yields scale as d_i, and g' = sum_i d_i (w_i / d_i)
    is a second linear system in d beside L^T dL/db = Q_hat d. The next layer's output
    gradients are larger than this layer's (they have not yet passed through its weights), so
    under noise of one level on every entry the joint fit pins d far better than the bias
    gradient alone, and the bias gradient alone is already exact without noise.
    """
    nxt = obs.next_layer
    assert nxt is not None
    for _ in range(_SCALE_REFITS):
        hidden = torch.relu((mixed_inputs / scales[:, None]) @ obs.weight.T + obs.bias)
        per_scale = nxt.grad_weight @ torch.linalg.pinv(hidden) / scales  # k x B: w_i / d_i
        system = torch.cat([q_hat, weight * per_scale])
        scales = _usable(_lstsq(system, torch.cat([target, weight * nxt.grad_bias])))
    return scales


def solve_inputs(
    columns: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
    next_weight: float = 0.0,
) -> Solution:
    """Scale the unit ``columns`` (B x B, one per row) from the bias gradient and solve for X.

    dL/db = L Q 1, so with Q = Q_hat diag(d), L^T dL/db = Q_hat d fixes scale and sign of each
    column at once (L has orthonormal columns). With ``next_weight`` (and ``obs.next_layer``
    given) the scales are then refitted to the next layer's gradient as well, its equations
    weighted by it (:func:`next_layer_scales`).
    """
    q_hat = columns.T
    target = left.T @ obs.grad_bias
    mixed_inputs = torch.linalg.lstsq(q_hat, right).solution
    scales = _usable(_lstsq(q_hat, target))
    if next_weight and obs.next_layer is not None:
        scales = next_layer_scales(q_hat, target, mixed_inputs, scales, obs, next_weight)
    inputs = mixed_inputs / scales[:, None]
    return Solution(inputs=inputs, matching=sparsity_matching(columns, inputs, left, obs, rule))


def inactive_neurons(inputs: torch.Tensor, obs: LayerObservation) -> torch.Tensor:
    """Which neurons each input (n, or c x n) leaves inactive at the sent weights."""
    return inputs @ obs.weight.T + obs.bias <= 0


def sparsity_matching(
    columns: torch.Tensor,
    inputs: torch.Tensor,
    left: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
) -> torch.Tensor:
    """Per sample, the Jaccard index between the zeros of L q_i (``columns``, B x B) and the
    inactive neurons of its input (``inputs``, B x n)."""
    zero = zero_mask(left, columns, rule)  # B x m: each sample's zero output gradients
    inactive = inactive_neurons(inputs, obs)
    union = (zero | inactive).sum(dim=1).clamp_min(1)
    return ((zero & inactive).sum(dim=1) / union).to(torch.float64)


def inactive_noise(
    columns: torch.Tensor,
    inputs: torch.Tensor,
    left: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
) -> torch.Tensor:
    """Per sample, the mean square of L q_i over the neurons its input leaves inactive, in units
    of the noise variance of that column's entries (``inf`` without a noise level).

    Where noise or float32 round-off blurs which entries count as zero, a true column is noise
    on its inactive neurons (about 1; a float32 client after 100 SGD steps: at most 3.2 over 32
    samples, where entries of up to 7.7 std there made the zero sets miss rows and the
    matching fall to 0.80 with every sample exact), while a mix carries another sample's
    gradient there, at the level of its signal.
    """
    std = rule.entry_std(columns)
    if not bool((std > 0).all()):
        return torch.full((columns.shape[0],), torch.inf, dtype=torch.float64)
    y = columns @ left.T
    inactive = inactive_neurons(inputs, obs)
    square = (y / std[:, None]).square() * inactive
    return (square.sum(dim=1) / inactive.sum(dim=1).clamp_min(1)).to(torch.float64)


def refit_to_inputs(
    columns: torch.Tensor,
    rows: torch.Tensor,
    inputs: torch.Tensor,
    left: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
) -> torch.Tensor:
    """``columns`` with each row selected by ``rows`` (B, bool) replaced by the direction that
    is smallest on its input's inactive neurons, in units of the noise each direction carries:
    the least eigenvector of D L_I^T L_I D with D = diag(S) (so that q = D p has noise
    ||S^-1 q|| = ||p||). A column estimated from a blurred zero set is sharpened; a mix in
    sample j's place, whose input x_j is right, is replaced by q_j itself."""
    refitted = columns.clone()
    scale = 1 / rule.inverse_singular
    for i in torch.nonzero(rows).flatten().tolist():
        inactive = inactive_neurons(inputs[i], obs)
        weighted = left[inactive.flatten()] * scale
        _, vectors = torch.linalg.eigh(weighted.T @ weighted)
        refitted[i] = canonical_sign((vectors[:, 0] * scale)[None])[0]
    return refitted


def fits_a_column(
    inputs: torch.Tensor, left: torch.Tensor, obs: LayerObservation, rule: ZeroRule
) -> torch.Tensor:
    """Per input (c x n), whether exactly one direction of the gradient's column space vanishes
    on the neurons it leaves inactive at the sent weights, as its own column does if it is a
    sample of a one-step batch, and that direction has no more than STRAY_MAX of its zeros on
    neurons the input activates. Vanishing is to the noise (mean square at most
    QUIET_INACTIVE noise variances, directions weighted as in :func:`refit_to_inputs`) or to
    the round-off.

    Two neurons agreeing on dW_j / db_j vouch for one sample only where co-active samples'
    output gradients are not proportional. In a binary one-hidden-layer net they are (every
    row is w_j sum_S s_i x_i), so two neurons active for the same samples agree on a blend of
    them (n=20, m=80, B=12, FedSGD: blends certified in 2 of 3 batches). A blend inactive
    only where all its samples are leaves every mix of their columns vanishing there; one
    inactive on fewer neurons than a sample leaves that sample's column, with zeros where the
    blend is active. Neither passes; a few blends in a hundred still do, which is why the
    engine also drops every candidate where more are agreed on than the batch has samples.
    """
    scale = 1 / rule.inverse_singular
    fits = torch.zeros(inputs.shape[0], dtype=torch.bool, device=inputs.device)
    for i, x in enumerate(inputs):
        inactive = inactive_neurons(x, obs)
        if int(inactive.sum()) < left.shape[1]:
            continue  # too few zeros to pin a column
        if rule.noise_std:
            rows = left[inactive] * scale
            bound = QUIET_INACTIVE * rule.noise_std**2 * int(inactive.sum())
        else:
            rows = left[inactive]
            bound = (_ROUNDOFF_FACTOR * rule.relative) ** 2
        values, vectors = torch.linalg.eigh(rows.T @ rows)
        if not (float(values[0]) <= bound < _PIN_GAP * float(values[1])):
            continue
        column = canonical_sign((vectors[:, 0] * scale if rule.noise_std else vectors[:, 0])[None])
        zero = zero_mask(left, column, rule)[0]
        fits[i] = int((zero & ~inactive).sum()) <= STRAY_MAX * int(zero.sum())
    return fits


def pin_slack(columns: torch.Tensor, left: torch.Tensor, rule: ZeroRule) -> torch.Tensor:
    """Per column q_i (c x B), how far, as a share of its norm, a direction can move from it
    while vanishing on q_i's zeros no less than q_i does: the residual of q_i on those rows of
    L over the second-smallest singular value they have (the smallest belongs to q_i's own
    direction). Zeros pin a column only as firmly as that gap: where another column nearly
    vanishes on them too (a trained network, a multi-step update), q_i plus a share of it
    passes as well, and the solve puts that share of one input into another sample's (a
    float64 FedAvg update: 16 of 16 certified, one input at 68 dB, slack 3e-3)."""
    zero = zero_mask(left, columns, rule)
    unit = columns / columns.norm(dim=1, keepdim=True).clamp_min(torch.finfo(columns.dtype).tiny)
    slack = torch.full((columns.shape[0],), float("inf"), dtype=torch.float64)
    for i in range(columns.shape[0]):
        rows = left[zero[i]]
        if rows.shape[0] < left.shape[1]:
            continue  # too few zeros to pin a direction
        gap = torch.linalg.eigvalsh(rows.T @ rows)[1].clamp_min(0.0)
        residual = (rows @ unit[i]).square().sum()
        if float(gap) > 0:
            slack[i] = float((residual / gap).sqrt())
    return slack


def pin_spread(
    columns: torch.Tensor, slack: torch.Tensor, right: torch.Tensor, inputs: torch.Tensor
) -> torch.Tensor:
    """Per sample, a first-order bound on the error, relative to its norm, that the columns'
    :func:`pin_slack` can put into its input.

    With X = diag(c)^-1 Q^-1 R (unit columns q_i, scales c from the bias gradient), moving q_i
    by d changes Q^-1 R in row k by -(Q^-1 d)_k c_i x_i and c_k by -(Q^-1 d)_k c_i, so x_k
    moves by (Q^-1 d)_k (c_i / c_k) (x_k - x_i). With |d| at most q_i's slack s_i:
    |dx_k| / |x_k| <= |row k of Q^-1| sum_i s_i (|c_i| / |c_k|) (1 + |x_i| / |x_k|).
    A loose column only matters where it meets a sample's row of Q^-1 and a sample of
    comparable scale: on [0, 1] pixels columns sit at slacks of 1e-8 (the batch's activity
    patterns are alike, so another column nearly vanishes on each one's zeros too) and every
    input is exact, where a FedAvg column at 3e-3 put a third sample at 68 dB.
    """
    q_hat = columns.T
    unscaled = torch.linalg.lstsq(q_hat, right).solution  # rows c_k x_k
    size = inputs.norm(dim=1)
    tiny = torch.finfo(size.dtype).tiny
    scale = unscaled.norm(dim=1) / size.clamp_min(tiny)  # |c_k|
    inverse, info = torch.linalg.inv_ex(q_hat)
    if int(info):
        return torch.full_like(size, float("inf"))
    rows = inverse.norm(dim=1)
    weight = slack.to(size) * scale
    spread = (
        rows / scale.clamp_min(tiny) * (weight.sum() + (weight * size).sum() / size.clamp_min(tiny))
    )
    return torch.nan_to_num(spread, nan=float("inf"))


def stray_zeros(
    columns: torch.Tensor,
    inputs: torch.Tensor,
    left: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
) -> torch.Tensor:
    """Per sample, the share of the zeros of L q_i that fall on neurons its input activates at
    the sent weights (W_j x_i + b_j > 0).

    A true column of a one-step update has none: its zeros are its inactive neurons (and
    neurons the layers above give no gradient). A mix of columns whose output gradients cancel
    (any C samples of a one-hidden-layer net with C classes) is zero where they are all
    active too, so put in sample j's place about half its zeros are neurons x_j activates. A
    multi-step update's true columns drift from the sent weights by the few neurons that local
    training switched off (see :data:`STRAY_MAX`).
    """
    zero = zero_mask(left, columns, rule)
    active = ~inactive_neurons(inputs, obs)
    return ((zero & active).sum(dim=1) / zero.sum(dim=1).clamp_min(1)).to(torch.float64)


def complete_basis(columns: torch.Tensor, spares: torch.Tensor, size: int) -> torch.Tensor:
    """Fill a short set of columns up to ``size``: best spares first, then an orthonormal
    complement of their span (step 7), so a short pool still yields a partial reconstruction."""
    chosen = torch.cat([columns, spares[: size - columns.shape[0]]])
    missing = size - chosen.shape[0]
    if missing > 0:
        u, _, _ = torch.linalg.svd(chosen.T, full_matrices=True)
        chosen = torch.cat([chosen, u[:, chosen.shape[0] :].T])
    return chosen


def greedy_select(
    pool: torch.Tensor,
    size: int,
    left: torch.Tensor,
    right: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
    sweeps: int,
) -> tuple[torch.Tensor, Solution]:
    """SPEAR's selection: from more than ``size`` candidate columns (rows of ``pool``, sorted by
    preference) pick ``size``, swapping greedily while the total sparsity matching rises.

    Each outside candidate is tried in place of the chosen column it is most aligned with, the
    one it most plausibly competes with; a swap is kept when the total matching rises.
    """
    chosen = list(range(size))
    best = solve_inputs(pool[chosen], left, right, obs, rule)
    for _ in range(sweeps):
        improved = False
        for cand in range(size, pool.shape[0]):
            if cand in chosen:
                continue
            rival = int((pool[chosen] @ pool[cand]).abs().argmax())
            trial = chosen.copy()
            trial[rival] = cand
            solution = solve_inputs(pool[trial], left, right, obs, rule)
            if solution.score > best.score:
                chosen, best, improved = trial, solution, True
        if not improved:
            break
    return pool[chosen], best
