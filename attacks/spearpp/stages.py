"""The stages of one SPEAR++ attack, in the order :func:`attacks.spearpp.engine.run_spearpp`
runs them, each over the one :class:`~attacks.spearpp.state.SpearState`: the search's set-up
after the factorisation, the sign-consistency rounds, passes of random starts, the selection of
B columns and the inputs they give, and the repair of a full pool that holds a mix."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from attacks.result import Reconstruction
from attacks.spearpp.certify import (
    EXACT_MATCHING,
    MIX_SUSPECTS,
    REPAIR_PATIENCE,
    REPAIRS,
    coarse_certificate,
    evict_mismatched,
)
from attacks.spearpp.config import SpearConfig
from attacks.spearpp.coupled import COUPLING_GAP, Coupling, coupling
from attacks.spearpp.deflate import complement_probes
from attacks.spearpp.factor import Factorisation
from attacks.spearpp.faint import faint_count
from attacks.spearpp.harvest import Clock, Harvester
from attacks.spearpp.hidden import NextBases, next_layer_bases
from attacks.spearpp.inputs import LayerObservation
from attacks.spearpp.next_noise import next_layer_weight
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.rounds import (
    budget_clock,
    complement_round,
    deflate,
    faint_noise,
    few_missing,
    few_zero_rows,
    sign_rounds,
)
from attacks.spearpp.search import random_starts, run_search
from attacks.spearpp.signs import SignGeometry
from attacks.spearpp.solve import Solution, complete_basis, greedy_select, solve_inputs
from attacks.spearpp.state import SpearState
from attacks.spearpp.zero_rule import ZeroRule

log = logging.getLogger(__name__)

# One view of the sign search: its geometry, the next layer's row space and coupling on its
# rows, and the rows per null step (None: the default).
View = tuple[SignGeometry, NextBases | None, int | None, Coupling | None]

# Idle sign rounds on every row before the search goes on with the live rows, where some
# neurons are silent (see search_signs): on [0, 1] pixels, B=50, m=1000, rounds on every row
# ran 52 s for 12 of 50 columns, the live rows' found all 50 in 1 s.
FIRST_PATIENCE = 2
# Bias share (LayerObservation.bias_share) above which the noisy search's fits are affine:
# dropping biases of share r flips about atan(r) / pi of a pattern's entries (CIFAR-10 images,
# 0.013 to 0.029: 1%; breast-cancer records standardised, 0.20: 7% measured), and true
# columns scored 0.93 to 0.99 against the 0.92 agreement threshold. A float32 client's update of
# standardised records, B=20, m=256, whose round-off the engine takes as noise: linear fits
# kept 10 to 15 of 20 columns, no sample near-exact.
_BIAS_MATTERS = 0.05
# Weight of a uniform direction mixed into starts orthogonal to the found columns: with one or
# two columns missing the complement is a line or a plane, and starts must still differ.
_START_SPREAD = 0.5


def settings_of(
    obs: LayerObservation,
    config: SpearConfig,
    fac: Factorisation,
    batch_size: int | None,
    declared_noise: float | None,
    silent: int,
) -> tuple[dict[str, Any], str, bool]:
    """The settings every record carries, the null steps' rule and whether the scales come
    from the next layer's bias gradient too; ``silent`` neurons were left out of the search
    (see :attr:`LayerObservation.silent`)."""
    noise_std = fac.noise_std  # declared, or fitted to the spectrum
    # Without noise the bias gradient fixes the scales exactly already.
    next_layer = config.next_layer_scale and obs.next_layer is not None and bool(noise_std)
    null_step = config.null_step
    if null_step == "auto":  # see SpearConfig.null_step
        null_step = "inverse"
    settings = {
        **config.as_dict(),
        "refinement": config.refinement,
        "device_used": str(obs.grad_weight.device),
        "declared_batch_size": batch_size,
        "declared_noise_std": declared_noise,
        "precision": obs.precision,
        "precision_from": obs.precision_from,
        "silent_neurons": silent,
        "null_step_used": null_step,
        "scales_from": "this and the next layer's bias gradients"
        if next_layer
        else "bias gradient",
    }
    return settings, null_step, next_layer


def nothing_to_attack(
    obs: LayerObservation,
    fac: Factorisation,
    clock: Clock,
    started: float,
    settings: dict[str, Any],
) -> Reconstruction:
    """The reconstruction of a gradient in which no sample stands above the noise."""
    clock.seconds["total"] = time.perf_counter() - started
    return Reconstruction(
        inputs=torch.zeros(0, obs.input_dim, dtype=torch.float64),
        batch_size=0,
        batch_size_method=fac.method,
        status="failed",
        confidence=torch.zeros(0, dtype=torch.float64),
        verified=torch.zeros(0, dtype=torch.bool),
        certified=torch.zeros(0, dtype=torch.bool),
        timings=clock.seconds,
        counts={"starts": 0, "passes": 0, "candidates": 0, "unique": 0, "selected": 0},
        settings=settings,
        reason="no singular value of the gradient stands above the noise",
        **fac.report(),
    )


def _roundoff_level(fac: Factorisation) -> float:
    """:attr:`ZeroRule.roundoff`: the level of the spectrum's bulk beyond B, where the gradient
    carries neither noise nor fitted float32 round-off (both enter the rule as noise). The
    median of the values past B, not the first: samples too weak for the rank's floor sit
    there (a memorised network, B=20: B_hat=18, s_19 / s_1 = 2.5e-11 and s_20 / s_1 = 4.6e-14
    above a bulk flat at 1.2e-15; taken as the round-off, s_19 let mixes pass for columns)."""
    values = fac.singular_values
    if fac.noise_std or fac.roundoff_std or values.shape[0] <= fac.batch_size:
        return 0.0
    return float(values[fac.batch_size :].median())


def prepared(
    obs: LayerObservation,
    config: SpearConfig,
    fac: Factorisation,
    clock: Clock,
    generator: torch.Generator,
    started: float,
    chosen: tuple[dict[str, Any], str, bool],
) -> SpearState:
    """The search's state once the gradient is factorised: the zero rule, the empty pool, the
    harvester, and the time budget's clock, started now."""
    settings, null_step, next_layer = chosen
    b, left, noise_std = fac.batch_size, fac.left, fac.noise_std
    next_weight = 0.0
    if next_layer and obs.next_layer is not None:
        next_weight = next_layer_weight(obs.next_layer, b, float(noise_std))
        settings["next_layer_weight"] = next_weight
    rule = ZeroRule(
        relative=config.zero_tol or obs.precision,
        # A float32 gradient's round-off is noise to its weak samples' zeros (see
        # Factorisation.roundoff_std): every check works as under noise of that level.
        noise_std=float(noise_std or 0.0) or fac.roundoff_std,
        inverse_singular=1.0 / fac.singular_values[:b],
        roundoff=_roundoff_level(fac),
    )
    pool = ColumnPool(b, obs.grad_weight.device, spares=2 * b, same_cosine=rule.same_column_cosine)
    search_left = left.to(getattr(torch, config.search_dtype))
    harvest = Harvester(left, search_left, rule, config, pool, clock, generator)
    harvest.engine_rows = faint_noise(fac)
    harvest.inputs = (fac.right, obs.grad_bias, obs.weight, obs.bias)
    spent = budget_clock(config.budget_clock)

    def out_of_time() -> bool:
        budget = config.time_budget_s
        return budget is not None and spent() > budget

    return SpearState(
        obs=obs,
        config=config,
        generator=generator,
        clock=clock,
        started=started,
        fac=fac,
        settings=settings,
        null_step=null_step,
        next_weight=next_weight,
        rule=rule,
        pool=pool,
        harvest=harvest,
        out_of_time=out_of_time,
    )


def search_signs(state: SpearState) -> None:
    """Rounds of the sign-consistency search until the pool is full or they stall: on every
    row, and where some neurons are silent, on the live rows and on every row again."""
    obs, harvest, b = state.obs, state.harvest, state.batch_size
    with state.clock.stage("search"):
        # Under noise the fits stay linear where the biases are small next to W x: the
        # halfspace thresholds there (harvest._NOISY_MIN_AGREEMENT) were measured so, and DP
        # sigma=1e-4 fell below 90% near-exact with affine ones. Where they are not, dropping
        # them flips a pattern's entries past that threshold's slack, so true columns fail it
        # (see _BIAS_MATTERS).
        linear = state.rule.noise_std and obs.bias_share < _BIAS_MATTERS
        bias = None if linear else obs.bias
        state.geom = geom = SignGeometry.build(state.fac.left, state.fac.right, obs.weight, bias)
        if obs.next_layer is not None:
            # One sketch of the next layer's gradient serves both (its row and column spaces).
            # The hidden vectors' coordinates need the affine fits, not the exact rank: each is
            # used only where its residual says the row space holds it (a memorised network,
            # m=1000, B=150, its own images: 141 samples above the round-off and 9 fading into
            # it, no gap over 14 at B_hat; the rounds held no pattern, 0 of 150 samples exact;
            # with them 124, 56 certified by the next layer). The coupled search proposes
            # points only, and serves under noise too (float32).
            faint = not coarse_certificate(state) and bool(
                faint_count(state.fac.singular_values, state.fac.batch_size)
            )
            bases = next_layer_bases(obs.next_layer, b, COUPLING_GAP)
            if bases is not None:
                state.coupling = coupling(obs.next_layer, b, bases)
            elif faint:
                # Samples fading into the round-off past B_hat leave no gap at B in the next
                # layer's spectrum either (m=1000 trained 40 epochs, its own images, B=150:
                # 7.4e-12 then 6.4e-12 of s_1 there; 0 of 150 exact without its row space).
                # The fits add their directions back (attacks.spearpp.faint) and hold only
                # the inputs the row space holds to round-off.
                bases = next_layer_bases(obs.next_layer, b, min_gap=1.0)
            if bases is not None and bias is not None:
                state.hidden = bases._replace(tilted=faint)
        live = ~obs.silent
        silent = int((~live).sum())
        few_rows = few_zero_rows(int(live.sum()), b, silent) if silent else None
        if state.coupling is not None:
            # Silent neurons mark inputs that share a dominant component ([0, 1] pixels), and
            # there the coupled points land in float64 where float32's miss: B=125, m=1000,
            # seed 2, 43 of 125 exact in 300 s with float32 points, 125 in 28 s with float64;
            # B=256, m=4000, seed 2, 50 of 256 and 256 in 239 s. Centred inputs keep the
            # config's float32, where the points land as often in two thirds of the time
            # (coupled_search).
            dtype = torch.float64 if silent else getattr(torch, state.config.search_dtype)
            state.coupling = state.coupling._replace(dtype=dtype)
            state.settings["coupled_dtype"] = str(dtype).removeprefix("torch.")
        state.settings["few_zero_rows"] = few_rows
        # On every row the fewer rows too under noise only: a float32 layer's first try finds
        # columns on them (n=20, m=80, 10 classes, B=12: 40 where the default finds 25, 5 seeds),
        # where without noise they verified mixes of a 3-class layer's columns that left its
        # batch at 1 of 240 samples exact (14 with the default).
        first_rows = few_rows if state.rule.noise_std else None
        views: list[View] = [(geom, state.hidden, first_rows, state.coupling)]
        if silent:
            # Then on the neurons some sample activated (LayerObservation.silent): silent rows
            # vanish in every direction, yet they are the deepest rows of every sample's
            # pattern, so the null steps take them and pin nothing ([0, 1] pixels, B=20,
            # m=256: 4 of 20 samples on every row, 20 of 20 in 2 s on the live rows; B=50,
            # m=1000: 12 of 50, and 50 of 50). Every row first: a multi-step update's columns
            # have few zeros besides the silent ones (n=20, m=80, B=12, three epochs of FedAvg:
            # 1 of 12 columns on the live rows, 12 of 12 on all), and on a one-hidden-layer net
            # the live rows' search settles on mixes that verify (C=10, B=12: 3 of 10 seeds).
            live_rows = SignGeometry.build(
                state.fac.left[live],
                state.fac.right,
                obs.weight[live],
                None if bias is None else bias[live],
            )
            # And every row again, with the config's patience, for what the live rows miss
            # (the FedAvg rows above: a last column that the first try's two idle rounds left).
            live_hidden = (
                None
                if state.hidden is None
                else state.hidden._replace(rows=state.hidden.rows[live])
            )
            live_coupling = None if state.coupling is None else state.coupling.on_rows(live)
            # Fewer rows per null step on the live rows (see few_zero_rows); every row again
            # with the default.
            views += [
                (live_rows, live_hidden, few_rows, live_coupling),
                (geom, state.hidden, None, state.coupling),
            ]
    harvest.pre = geom.affine()
    for index, (view, hidden, rows, coupled) in enumerate(views):
        # Every row is a first try: where it stalls, a few idle rounds say so.
        patience = FIRST_PATIENCE if len(views) > 1 and index == 0 else None
        rounds, starts = sign_rounds(
            harvest, view, b, state.generator, state.out_of_time, state.null_step, patience,
            hidden, rows, coupled,
        )  # fmt: skip
        state.sign_rounds += rounds
        state.sign_starts += starts
        if len(state.pool) >= b:
            break
    if few_missing(state.config, b, len(state.pool)):
        deflate(harvest, b, state.generator)
    log.info(
        "SPEAR++ sign search: %d columns verified for %d samples in %d rounds (%.1f s)",
        len(state.pool),
        b,
        state.sign_rounds,
        time.perf_counter() - state.started,
    )


def search_passes(state: SpearState) -> None:
    """Passes of random starts (orthogonal to the columns found, with ``deflate``) until the
    pool is full, ``max_passes`` ran or the time budget is spent."""
    config, pool, harvest, b = state.config, state.pool, state.harvest, state.batch_size
    generator, out_of_time = state.generator, state.out_of_time
    chunk = max(1, min(config.starts, config.max_elements // state.obs.width))
    search_left = harvest.search_left
    while state.passes < config.max_passes and len(pool) < b:
        if out_of_time():
            log.info(
                "time budget of %.0f s spent after %d passes", config.time_budget_s, state.passes
            )
            break
        state.passes += 1
        for offset in range(0, config.starts, chunk):
            if offset and out_of_time():
                break
            count = min(chunk, config.starts - offset)
            # Once columns are known, start orthogonal to all of them: uniform starts fall
            # mostly back into the large basins of columns already found.
            fresh = (
                complement_probes(pool.columns, count, generator, spread=_START_SPREAD)
                if config.deflate and len(pool)
                else random_starts(count, b, generator)
            )
            with state.clock.stage("search"):
                points = run_search(search_left, fresh, config, harvest)
            harvest(points, final=True)
            state.starts += count
            if len(pool) >= b:
                break
        if few_missing(config, b, len(pool)):
            deflate(harvest, b, generator)
            if state.geom is not None:
                complement_round(harvest, state.geom, generator, state.null_step)
        log.info(
            "SPEAR++ pass %d/%d: %d columns verified for %d samples (%d starts, %.1f s)",
            state.passes,
            config.max_passes,
            len(pool),
            b,
            state.starts,
            time.perf_counter() - state.started,
        )


def select_and_solve(state: SpearState) -> None:
    """The pool's columns, B of them, and the inputs they give (``state.found``,
    ``.columns``, ``.solution``)."""
    found, columns, solution = _selected(state)
    state.found, state.columns, state.solution = found, columns, solution


def _selected(state: SpearState) -> tuple[int, torch.Tensor, Solution]:
    pool, harvest, b, obs, fac = state.pool, state.harvest, state.batch_size, state.obs, state.fac
    with state.clock.stage("select"):
        found = len(pool)
        order = pool.zeros.argsort(descending=True)
        if found > b:
            columns, solution = greedy_select(
                pool.columns[order], b, fac.left, fac.right, obs, state.rule,
                state.config.selection_sweeps,
            )  # fmt: skip
        elif found == b - 1 and harvest.unpinned is not None:
            columns = torch.cat([pool.columns[order], harvest.unpinned.column[None]])
        else:
            columns = complete_basis(pool.columns[order], pool.spares(), b)
    with state.clock.stage("solve"):
        if found <= b or state.next_weight:
            solution = solve_inputs(
                columns, fac.left, fac.right, obs, state.rule, state.next_weight
            )
    return found, columns, solution


def repair(state: SpearState) -> None:
    """Evict a mix from a full pool whose samples do not all match, search on, and keep the
    new selection where it matches better (at most ``REPAIRS`` times)."""
    b, geom = state.batch_size, state.geom
    while (
        coarse_certificate(state)
        and geom is not None
        and state.found >= b
        and state.solution is not None
        and 0 < int((state.solution.matching < EXACT_MATCHING).sum()) <= MIX_SUSPECTS
        and state.repairs < REPAIRS
        and not state.out_of_time()
    ):
        # A full pool whose samples do not all match holds a mix that passed the noise-level
        # certificate: evict it and the samples it corrupts, and search on (DP sigma=1e-6,
        # B=150, m=4000: one mix, two samples under 0.95, 149 of 150 near-exact).
        assert state.columns is not None
        state.repairs += 1
        evict_mismatched(state.pool, state.columns, state.solution.matching < EXACT_MATCHING)
        state.harvest.reopen()
        more_rounds, more_starts = sign_rounds(
            state.harvest, geom, b, state.generator, state.out_of_time, state.null_step,
            REPAIR_PATIENCE, state.hidden, None, state.coupling,
        )  # fmt: skip
        state.sign_rounds += more_rounds
        state.sign_starts += more_starts
        if few_missing(state.config, b, len(state.pool)):
            deflate(state.harvest, b, state.generator)
        again = _selected(state)
        if again[0] < b or float(again[2].matching.min()) <= float(state.solution.matching.min()):
            break  # no better: keep what the search had before
        state.found, state.columns, state.solution = again
