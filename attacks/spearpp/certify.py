"""The SPEAR++ certificate: which recovered samples the attack vouches for without ground
truth, and the reconstruction it reports. A mix of columns can be as sparse as a true one where
the output gradients are dependent; each rule here withholds the certificate from what a mix
could explain (see docs/certificate.md)."""

from __future__ import annotations

import time

import torch

from attacks.result import Reconstruction, Status
from attacks.spearpp.faint import faint_count, with_faint
from attacks.spearpp.hidden import (
    AGREE,
    InputSpan,
    column_inputs,
    confirmed_inputs,
    repeated,
)
from attacks.spearpp.inputs import FLOAT32_PRECISION, LayerObservation
from attacks.spearpp.isolate import isolated_samples, with_isolated
from attacks.spearpp.last_column import settle_uncertain
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.solve import (
    PIN_SPREAD_EXACT,
    QUIET_INACTIVE,
    STRAY_MAX,
    Solution,
    fits_a_column,
    inactive_noise,
    pin_slack,
    pin_spread,
    refit_to_inputs,
    solve_inputs,
    sparsity_matching,
    stray_zeros,
)
from attacks.spearpp.state import SpearState
from attacks.spearpp.zero_rule import ZeroRule

# |cosine| at which a selected column is one of the last column's uncertain ones.
SAME_DIRECTION = 1 - 1e-9
# Lowest sparsity matching coefficient of a sample in a batch called exact.
EXACT_MATCHING = 0.95
# Evictions of a suspected mix from a full pool (see evict_mismatched), each followed by sign
# rounds until the pool is full again: one suffices where a mix passed under little noise (DP
# sigma=1e-6, B=150, m=4000), a second covers a wrong guess of which suspect is the mix.
REPAIRS = 2
# Idle sign rounds after an eviction: where a mix was evicted the first round found the
# columns (DP sigma=1e-6, B=150, m=4000: 4 new in one round of 8 starts); where noise,
# not a mix, lowers the matching (DP sigma=1e-4, B=20, m=200) none does, and the default
# patience made the attack 3 to 8 times slower for nothing.
REPAIR_PATIENCE = 2
# Most samples under EXACT_MATCHING for which a repair is tried: a mix corrupts two; many
# more point to another cause (multi-step updates' zeros, scales), which evictions cannot fix.
MIX_SUSPECTS = 4


def agreeing(
    solution: Solution,
    columns: torch.Tensor,
    left: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
) -> torch.Tensor:
    """Per sample, whether its column's zeros agree with its input's inactive neurons at the
    noise level: they match (EXACT_MATCHING), or the column is only noise on the inactive
    neurons (solve.QUIET_INACTIVE) and has no more than STRAY_MAX of its zeros on active ones."""
    inputs = solution.inputs
    quiet = inactive_noise(columns, inputs, left, obs, rule) <= QUIET_INACTIVE
    quiet &= stray_zeros(columns, inputs, left, obs, rule) <= STRAY_MAX
    return (solution.matching >= EXACT_MATCHING) | quiet


def evict_mismatched(pool: ColumnPool, columns: torch.Tensor, mismatched: torch.Tensor) -> None:
    """Evict the columns of a full pool's samples whose zeros do not match their inputs, and
    ban the one with the fewest zeros.

    A mix of q_j and q_k in q_j's place leaves sample j's input right but sample k's a mix
    (the inverse of Q changes only in row k), so both match poorly; the mix is zero only
    where both columns are, the true q_k wherever it is.
    """
    suspect = columns[mismatched]
    drop = (pool.columns @ suspect.T).abs().amax(dim=1) >= SAME_DIRECTION
    fewest = torch.where(drop, pool.zeros, pool.zeros.max() + 1).argmin()
    pool.evict(drop, torch.arange(len(pool), device=drop.device) == fewest)


def coarse_certificate(state: SpearState) -> bool:
    """Whether verified columns can still be off: under noise, or at float32's round-off.

    Exact then needs each sample's inactive neurons to match its gradient's zeros too (16
    float32 digits at m=200 verified 16 mixes). At float64's round-off the certificate is exact
    already, and multi-step updates legitimately match less: their zeros are those shared by
    every local step.
    """
    return bool(state.fac.noise_std) or state.obs.precision >= FLOAT32_PRECISION


def certified(state: SpearState) -> Reconstruction:
    """The reconstruction: the selected samples' inputs, which of them are certified, and the
    status and reason the attack reports."""
    obs, rule, generator, clock = state.obs, state.rule, state.generator, state.clock
    harvest, fac, b, found = state.harvest, state.fac, state.batch_size, state.found
    left, next_weight = fac.left, state.next_weight
    columns, solution = state.columns, state.solution
    assert columns is not None and solution is not None  # select_and_solve ran
    coarse = coarse_certificate(state)
    # Harvests inside the search were timed under both stages: report them under refine only.
    clock.seconds["search"] = clock.seconds.get("search", 0.0) - harvest.midway_seconds
    verified = torch.zeros(b, dtype=torch.bool)
    verified[: min(found, b)] = True
    agree = agreeing(solution, columns, left, obs, rule)
    if coarse and found >= b and not bool(agree.all()):
        # Weak samples' columns, estimated from zero sets the noise blurs, can sit off their
        # inputs' inactive neurons while every input is exact (float32, 100 SGD steps, B=32,
        # m=256: 2 of 20 batches). Refitted to those neurons and solved again, the batch counts
        # only if every sample then agrees.
        with clock.stage("solve"):
            refitted = refit_to_inputs(columns, ~agree, solution.inputs, left, obs, rule)
            resolved = solve_inputs(refitted, left, fac.right, obs, rule, next_weight)
        if bool(agreeing(resolved, refitted, left, obs, rule).all()):
            columns, solution, agree = refitted, resolved, torch.ones_like(agree)
    matched = not coarse or bool(agree.all())
    stray = stray_zeros(columns, solution.inputs, left, obs, rule)
    # A mix put in one sample's place corrupts another sample's input (a row of Q^-1), so one
    # inconsistent sample withdraws every column-based certificate of the batch.
    consistent = bool((stray <= STRAY_MAX).all())
    # Noiseless float64 columns vouch for exact inputs only where their zeros pin them firmly:
    # a share of another column slipped into one corrupts a third sample's input by that share.
    slack = torch.zeros(b, dtype=torch.float64)
    spread = torch.zeros(b, dtype=torch.float64)
    if not coarse:
        slack = pin_slack(columns, left, rule)
        spread = pin_spread(columns, slack, fac.right, solution.inputs)
    firm = spread.cpu() <= PIN_SPREAD_EXACT
    # The paper's filter (refine = "none") takes points as they are: a column it verifies is
    # near-sparse, not pinned by its zeros, so it vouches for no sample.
    certifying = state.config.refinement != "none"
    whole = certifying and found >= b and matched and consistent
    exact = whole and bool(firm.all())
    inputs = solution.inputs
    # Each sample is vouched for as far as the columns' slack leaves its own input exact.
    certified = firm if whole else torch.zeros(b, dtype=torch.bool)
    confidence, settled = solution.matching, 0
    if certifying and not exact and found == b - 1 and harvest.unpinned is not None and not coarse:
        # Every sample is fixed but those whose columns share the last one's zeros, which the
        # next layer's gradient fixes where it is given. (At float32's round-off or under
        # noise the found columns are not certain enough to vouch for samples this way.)
        doubtful = (columns @ harvest.unpinned.uncertain.T).abs().amax(dim=1) >= SAME_DIRECTION
        with clock.stage("solve"):
            inputs, fixed = settle_uncertain(inputs, doubtful, b - 1, obs)
            confidence = sparsity_matching(columns, inputs, left, obs, rule)
            stray = stray_zeros(columns, inputs, left, obs, rule)
        consistent = bool((stray <= STRAY_MAX).all())
        certified, settled = (~doubtful | fixed) & consistent, int(fixed.sum())
        exact = bool(certified.all())
    # A full pool whose samples' zeros fall on active neurons holds mixes, and mixes arise where
    # the output gradients are dependent; there two neurons of one active set agree as if one
    # sample were alone (binary one-hidden-layer nets: every row is w_j sum_S s_i x_i).
    mixed = found >= b and not consistent
    confirmed = 0
    geom, space = state.geom, state.hidden
    if geom is not None and space is not None and certifying and not (exact or coarse):
        # The next layer's row space confirms each input apart from the other columns (see
        # confirmed_inputs): a missing or loosely pinned column no longer withholds the rest,
        # nor does a mix, which corrupts inputs that then fit no hidden vector of the batch.
        assert obs.next_layer is not None  # the row space came from it
        with clock.stage("solve"):
            span, rows = with_faint(
                InputSpan.of(geom, fac.right),
                space.rows,
                obs.grad_weight,
                obs.weight,
                obs.next_layer.grad_weight,
                faint_count(fac.singular_values, fac.batch_size),
            )
            from_space, held, agree_both = confirmed_inputs(inputs, span, rows)
            # A strong sample's column missing tilts every input from the columns, so that
            # no input's pattern is its sample's (m=1000 trained 40 epochs, its own images,
            # B=150: 0 of 150 exact, 82 true columns among those chosen): each column's own
            # zeros give its sample's pattern apart from the others; where the input's own
            # pattern held too, the two must give the same input.
            lost = torch.nonzero(~agree_both & ~certified.to(held.device))[:, 0]
            by_zeros, zeros_held = column_inputs(columns[lost] @ left.T, span, rows)
            gap = (by_zeros - from_space[lost]).norm(dim=1)
            zeros_held &= ~held[lost] | (gap <= AGREE * from_space[lost].norm(dim=1))
            from_space[lost[zeros_held]] = by_zeros[zeros_held]
            held[lost[zeros_held]] = True
            agree_both[lost[zeros_held]] = True
        fresh = agree_both.to(certified.device) & ~certified
        replace = (held.to(certified.device) & ~certified).to(inputs.device)
        inputs = torch.where(replace[:, None], from_space, inputs)
        # Two columns that give one sample (a mix faint in all but one) vouch for it once.
        fresh &= ~repeated(inputs, certified, fresh)
        certified, confirmed = certified | fresh, int(fresh.sum())
        exact = bool(certified.all())
    if not exact and not mixed:
        with clock.stage("solve"):
            isolated = isolated_samples(
                obs.grad_weight, obs.grad_bias, obs.precision, generator, rule.noise_std
            )
            # More samples alone than the batch holds: neurons agree on blends of samples.
            isolated = isolated[fits_a_column(isolated, left, obs, rule) & (len(isolated) <= b)]
            inputs, alone = with_isolated(inputs, isolated)
            certified = certified | alone
    status: Status = "exact" if exact else ("partial" if found or certified.any() else "failed")
    clock.seconds["total"] = time.perf_counter() - state.started
    return Reconstruction(
        inputs=inputs.cpu(),
        batch_size=b,
        batch_size_method=fac.method,
        status=status,
        confidence=confidence.cpu(),
        verified=verified,
        certified=certified.cpu(),
        stray_zeros=stray.cpu(),
        timings=clock.seconds,
        counts={
            "starts": state.starts + state.sign_starts,
            "sign_rounds": state.sign_rounds,
            "passes": state.passes,
            "candidates": harvest.proposed,
            "unique": found,
            "selected": min(found, b),
            "settled_last": harvest.settled_last,
            "unpinned_last": int(harvest.unpinned is not None),
            "next_layer_settled": settled,
            "next_layer_certified": confirmed,
            "repairs": state.repairs,
        },
        settings=state.settings,
        reason=_reason(state, exact, mixed, certifying, stray, certified, confidence, slack, spread)
        + (
            f"; {confirmed} samples certified by the next layer's gradient (each input from "
            "its row space agrees with its columns' input or with its column's zeros)"
            if confirmed and not exact
            else ""
        ),
        **fac.report(),
    )


def _reason(
    state: SpearState,
    exact: bool,
    mixed: bool,
    certifying: bool,
    stray: torch.Tensor,
    certified: torch.Tensor,
    confidence: torch.Tensor,
    slack: torch.Tensor,
    spread: torch.Tensor,
) -> str:
    """Why the batch is not certified whole (empty when it is)."""
    b, found, harvest = state.batch_size, state.found, state.harvest
    if exact:
        return ""
    if not certifying:
        return (
            f"{min(found, b)} of {b} columns taken by the paper's filter (refine = 'none'), "
            f"which is no certificate: {int(certified.sum())} samples certified (only those a "
            "neuron isolates)"
        )
    if mixed:
        return (
            f"not identifiable from this update: all {b} columns verified, but "
            f"{int((stray > STRAY_MAX).sum())} samples' zeros fall on neurons their inputs "
            f"activate at the sent weights (up to {float(stray.max()):.2f} of them), as a mix "
            "of columns does where the output gradients are dependent (few classes above one "
            "hidden layer), or local training that drifted far from the sent weights; no "
            "sample is certified through its column"
        )
    reason = (
        f"{min(found, b)} of {b} columns verified, {int(certified.sum())} samples certified, "
        f"lowest sparsity matching {float(confidence.min()):.3f}"
    )
    loose = int((spread > PIN_SPREAD_EXACT).sum())
    if found >= b and loose:
        reason += (
            f"; columns are pinned loosely by their zeros (another column nearly vanishes "
            f"there too: slack up to {float(slack.max()):.1e}), so {loose} samples' inputs may "
            f"hold a share of another's (up to {float(spread.max()):.1e} of their norm)"
        )
    if found == b - 1 and harvest.unpinned is not None and not coarse_certificate(state):
        reason += (
            f"; the last sample's input is exact, but {int((~certified).sum())} samples' "
            "inputs are not: the last column's zeros are theirs too, "
            + (
                "and the next layer's gradient did not fix them"
                if state.obs.next_layer is not None
                else "and the next layer's gradient was not given"
            )
        )
    return reason
