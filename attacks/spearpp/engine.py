"""SPEAR++ end to end: factor, search, refine, pool, select, scale, solve."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from attacks.result import Reconstruction, Status
from attacks.spearpp.complement import complement_columns
from attacks.spearpp.config import SpearConfig
from attacks.spearpp.deflate import complement_probes, l1_on_hyperplanes
from attacks.spearpp.factor import Factorisation, factorise
from attacks.spearpp.inputs import FLOAT32_PRECISION, LayerObservation
from attacks.spearpp.isolate import isolated_samples, with_isolated
from attacks.spearpp.last_column import (
    LastColumn,
    last_column,
    noisy_last_column,
    settle_uncertain,
)
from attacks.spearpp.last_pair import last_pair
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.refine import ZeroRule, pin_rows, refine_kernel, refiner, zero_mask
from attacks.spearpp.search import random_starts, run_search
from attacks.spearpp.signs import (
    IRLS_STEPS,
    SignGeometry,
    deflation_basis,
    fit_inputs,
    halfspace_agreement,
    null_step_rows,
    sign_search,
)
from attacks.spearpp.solve import (
    QUIET_INACTIVE,
    STRAY_MAX,
    Solution,
    complete_basis,
    fits_a_column,
    greedy_select,
    inactive_noise,
    refit_to_inputs,
    solve_inputs,
    sparsity_matching,
    stray_zeros,
)

log = logging.getLogger(__name__)

# A live point is worth refining once its pin_rows-th smallest |L q| is this far below the
# median: unconverged directions sit near 0.1, converged ones below 1e-3.
_CONVERGED_RATIO = 1e-2
# At the end of a pass every point but the clearly unconverged ones is refined.
_FINAL_RATIO = 0.1
# Under declared noise, a verified candidate must also agree with a halfspace pattern on this
# share of rows: measured on DP sigma=1e-4, B=20, m=200, true columns scored 0.93 to 0.99 and the
# mixes that passed the noise-level certificate at most 0.90.
_NOISY_MIN_AGREEMENT = 0.92
# |cosine| at which a selected column is one of the last column's uncertain ones.
_SAME_DIRECTION = 1 - 1e-9
# Lowest sparsity matching coefficient of a sample in a batch called exact.
_EXACT_MATCHING = 0.95
# Convex trials per deflation round beyond two per missing column.
_DEFLATE_EXTRA = 4
# Weight of a uniform direction mixed into starts orthogonal to the found columns: with one or
# two columns missing the complement is a line or a plane, and starts must still differ.
_START_SPREAD = 0.5
# The convex search pays off only for the last few columns: with many missing, its optimum is
# mostly a mix of them.
_DEFLATE_MAX_MISSING = 4
# Largest factor by which idle sign rounds widen the next round's starts.
_SIGN_WIDEN_MAX = 16
# Share of zeros in the found columns (their median) above which the sign search null-steps on
# every zero of its converged points: honest layers have about half, a layer whose biases fire
# each neuron for a tenth of the samples 90%.
_SPARSE_LAYER = 0.75
# Random mixes of the missing columns' guesses per missing column, and the sizes of the
# random steps away from them.
_LAST_MIXES = 4
_LAST_SPREADS = (0.2, 0.4, 0.6)
# Multiply-adds of null steps per chunk of sign-search starts, between which the time budget
# is checked: about 10 to 30 s on one core. Rounds at B = 1024 and m = 4000 (8 starts, 2000
# rows each) and the last columns' searches at B = 256 (200 guesses on up to 2000 rows) ran
# one product for many minutes past a 600 s budget.
_CHUNK_WORK = 5e10
# Share of the columns missing at a fruitless complement round that must remain for another.
_COMPLEMENT_RETRY = 0.75
# Under noise, share of rows on which the last column's zeros must match the inactive neurons
# its closed form predicts (see noisy_last_column): the true column matched 99 of 100 at
# B=8, m=100 under SecAgg+'s quantisation, one zero just past the noise tolerance.
_LAST_MATCH = 0.95
# Evictions of a suspected mix from a full pool (see _evict_mismatched), each followed by sign
# rounds until the pool is full again: one suffices where a mix passed under little noise (DP
# sigma=1e-6, B=150, m=4000), a second covers a wrong guess of which suspect is the mix.
_REPAIRS = 2
# Idle sign rounds after an eviction: where a mix was evicted the first round found the
# columns (DP sigma=1e-6, B=150, m=4000: 4 new in one round of 8 starts); where noise,
# not a mix, lowers the matching (DP sigma=1e-4, B=20, m=200) none does, and the default
# patience made the attack 3 to 8 times slower for nothing.
_REPAIR_PATIENCE = 2
# Most samples under _EXACT_MATCHING for which a repair is tried: a mix corrupts two; many
# more point to another cause (multi-step updates' zeros, scales), which evictions cannot fix.
_MIX_SUSPECTS = 4
# Noise whose edge lies this far below the weakest sample's singular value does not steer the
# sign search (see _faint_noise).
_FAINT_NOISE = 1000.0


class _Clock:
    """Seconds spent per stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def _converged(points: torch.Tensor, left: torch.Tensor, rows: int, ratio: float) -> torch.Tensor:
    y = (points @ left.T).abs()
    kth = y.kthvalue(min(rows, y.shape[1]), dim=1).values
    return kth <= ratio * y.median(dim=1).values


class _Harvester:
    """Turns points of the search into pool columns, and counts what it saw."""

    def __init__(
        self,
        left: torch.Tensor,
        search_left: torch.Tensor,
        rule: ZeroRule,
        config: SpearConfig,
        pool: ColumnPool,
        clock: _Clock,
        generator: torch.Generator,
    ) -> None:
        self.left, self.search_left, self.rule, self.pool = left, search_left, rule, pool
        self.clock, self.generator, self.config = clock, generator, config
        self.rows = min(pin_rows(left.shape[1]), left.shape[0])
        # Each distinct mix is split once, whenever it turns up.
        self.refine = refiner(
            config.refinement, config.rounding_samples, config.split_mixtures, seen_mixes=set()
        )
        self.proposed = 0
        # [A, b] = [W V, b], set by the sign search: checks its candidates under noise (the
        # surrogate search alone stays the paper's method).
        self.pre: torch.Tensor | None = None
        # Refinement done from inside the search, which the search stage's clock also counts.
        self.midway_seconds = 0.0
        # (R, dL/db, W, b) for the last columns in closed form (last_pair, last_column; under
        # noise noisy_last_column); set by the engine.
        self.inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.settled_last = 0
        # Null steps on rows of U rather than U S (see sign_search): without noise, and under
        # a float32 gradient's round-off alone (trained B=50, m=1000, 1000 SGD steps: no
        # sample near-exact after 117 s on rows of U S, all 50 in 2 s on rows of U); set by
        # the engine (see _faint_noise).
        self.engine_rows = True
        self._pair_tried = self._last_tried = False
        # The last column's stand-in when its zeros do not pin it (see LastColumn).
        self.unpinned: LastColumn | None = None

    def reopen(self) -> None:
        """Try the closed forms of the last columns again: the pool lost columns."""
        self._pair_tried = self._last_tried = False
        self.unpinned = None

    def __call__(self, points: torch.Tensor, final: bool = False) -> torch.Tensor:
        """Refine the converged ``points`` into the pool; the mask of points to keep searching."""
        before = self.clock.seconds.get("refine", 0.0)
        try:
            return self._take(points, final)
        finally:
            if not final:
                self.midway_seconds += self.clock.seconds["refine"] - before

    def _take(self, points: torch.Tensor, final: bool) -> torch.Tensor:
        with self.clock.stage("refine"):
            ratio = _FINAL_RATIO if final else _CONVERGED_RATIO
            ready = _converged(points, self.search_left, self.rows, ratio)
        if ready.any():
            self.propose(points[ready])
        with self.clock.stage("refine"):
            return ~ready & ~self.pool.near_found(points, self.config.drop_cosine)

    def propose(self, points: torch.Tensor) -> int:
        """Refine and certify ``points``; the number of new columns."""
        self.proposed += int(points.shape[0])
        with self.clock.stage("refine"):
            cands = self.refine(self.left, points, self.rule, self.generator, self.pool.columns)
            if self.rule.noise_std and self.pre is not None and bool(cands.verified.any()):
                # The noise-level certificate passes some mixes; their activity patterns are
                # not halfspaces.
                active = ~zero_mask(self.left, cands.directions, self.rule)
                cands = cands.demote(halfspace_agreement(self.pre, active) >= _NOISY_MIN_AGREEMENT)
            grew = self.pool.add(cands)
            if self.inputs is not None:
                grew += self._closed_forms(self.inputs)
            return grew

    def _admit(self, column: torch.Tensor) -> int:
        """Add a column settled in closed form to the pool; 1, the number added."""
        self.pool.admit(column, zero_mask(self.left, column[None], self.rule).sum())
        self.settled_last += 1
        return 1

    def _closed_forms(
        self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> int:
        """Settle the last two columns in closed form where the pool lacks only those; the number
        settled. (The pool only grows: each count of missing columns is tried once.)"""
        b, grew = self.left.shape[1], 0
        if self.rule.noise_std:
            return self._noisy_last(inputs)
        if len(self.pool) == b - 2 and not self._pair_tried:
            self._pair_tried = True
            scan = last_pair(self.pool.columns, self.left, *inputs, self.rule)
            for q in scan.columns:
                grew += self._admit(q)
            if scan.candidates.shape[0]:
                known = self.pool.columns
                grew += self.pool.add(
                    refine_kernel(
                        self.left, scan.candidates, self.rule, False, self.generator, known
                    )
                )
        if len(self.pool) == b - 1 and not self._last_tried:
            self._last_tried = True
            last = last_column(self.pool.columns, self.left, *inputs, self.rule)
            if last is not None and last.pinned:
                grew += self._admit(last.column)
            elif last is not None:
                self.unpinned = last
        return grew

    def _noisy_last(
        self, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> int:
        """Under noise, the last column from its closed form, once: kept where the noise-level
        certificate verifies it and its zeros match the inactive neurons it predicts."""
        if len(self.pool) != self.left.shape[1] - 1 or self._last_tried:
            return 0
        self._last_tried = True
        last = noisy_last_column(self.pool.columns, self.left, *inputs)
        if last is None:
            return 0
        q, inactive = last
        cands = refine_kernel(
            self.left, q[None], self.rule, False, self.generator, self.pool.columns
        )
        zero = zero_mask(self.left, cands.directions, self.rule)
        match = (zero == inactive).to(self.left.dtype).mean(dim=1)
        grew = self.pool.add(cands.demote(match >= _LAST_MATCH))
        self.settled_last += grew
        return grew


def _agreeing(
    solution: Solution,
    columns: torch.Tensor,
    left: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
) -> torch.Tensor:
    """Per sample, whether its column's zeros agree with its input's inactive neurons at the
    noise level: they match (_EXACT_MATCHING), or the column is only noise on the inactive
    neurons (solve.QUIET_INACTIVE) and has no more than STRAY_MAX of its zeros on active ones."""
    inputs = solution.inputs
    quiet = inactive_noise(columns, inputs, left, obs, rule) <= QUIET_INACTIVE
    quiet &= stray_zeros(columns, inputs, left, obs, rule) <= STRAY_MAX
    return (solution.matching >= _EXACT_MATCHING) | quiet


def _evict_mismatched(pool: ColumnPool, columns: torch.Tensor, mismatched: torch.Tensor) -> None:
    """Evict the columns of a full pool's samples whose zeros do not match their inputs, and
    ban the one with the fewest zeros.

    A mix of q_j and q_k in q_j's place leaves sample j's input right but sample k's a mix
    (the inverse of Q changes only in row k), so both match poorly; the mix is zero only
    where both columns are, the true q_k wherever it is.
    """
    suspect = columns[mismatched]
    drop = (pool.columns @ suspect.T).abs().amax(dim=1) >= _SAME_DIRECTION
    fewest = torch.where(drop, pool.zeros, pool.zeros.max() + 1).argmin()
    pool.evict(drop, torch.arange(len(pool), device=drop.device) == fewest)


def _sparse_layer(pool: ColumnPool, m: int) -> bool:
    """Whether the columns found so far are mostly zeros (see ``sign_search``'s ``whole``)."""
    return bool(len(pool)) and float(pool.zeros.double().median()) > _SPARSE_LAYER * m


def _few_missing(config: SpearConfig, batch_size: int, found: int) -> bool:
    """Whether the convex searches for the last columns are worth running now."""
    missing = batch_size - found
    return config.deflate and 0 < missing <= max(_DEFLATE_MAX_MISSING, batch_size // 20)


def _deflate(harvest: _Harvester, batch_size: int, generator: torch.Generator) -> None:
    """Convex l1 searches aimed at the missing columns, round after round while they find any."""
    pool = harvest.pool
    while (missing := batch_size - len(pool)) > 0:
        with harvest.clock.stage("deflate"):
            probes = complement_probes(pool.columns, 2 * missing + _DEFLATE_EXTRA, generator)
            points = l1_on_hyperplanes(harvest.left, probes)
        if not harvest.propose(points):
            break


def _last_columns(
    geom: SignGeometry,
    basis: torch.Tensor,
    found: torch.Tensor,
    config: SpearConfig,
    null_step: str,
    generator: torch.Generator,
    engine_rows: bool,
    out_of_time: Callable[[], bool],
) -> torch.Tensor:
    """Sign searches from the best guess of the few missing columns (search coordinates).

    Every missing column is orthogonal to every found sample's input coordinates (P Q = I), so
    the complement of their estimates (``basis``) holds the guesses; their errors (a few
    degrees on trained networks, more where the found samples' inputs are poorly pinned) leave
    the guesses outside small basins, so random steps around them are tried too. A sample with
    many zeros is pulled in only by null steps on more rows than the default, one with few
    zeros only by fewer: each guess is run with several row counts.
    """
    b = basis.shape[0]
    m = geom.left.shape[0]
    complement = torch.linalg.svd(basis, full_matrices=True)[0][:, basis.shape[1] :]
    count = _LAST_MIXES * complement.shape[1]
    mixes = torch.randn(count, complement.shape[1], generator=generator, dtype=basis.dtype)
    guesses = torch.nn.functional.normalize(mixes.to(basis.device) @ complement.T, dim=1)
    # A cloud around the guesses: their errors reach 25 degrees or more where the found
    # samples' inputs are poorly pinned.
    cloud = torch.randn(len(_LAST_SPREADS) * count, b, generator=generator, dtype=basis.dtype)
    spreads = torch.tensor(_LAST_SPREADS, dtype=basis.dtype).repeat_interleave(count)[:, None]
    steps = (spreads * torch.nn.functional.normalize(cloud, dim=1)).to(basis.device)
    guesses = torch.cat([complement.T, guesses, guesses.repeat(len(_LAST_SPREADS), 1) + steps])
    default = null_step_rows(m, b)
    counts = sorted({min(2 * b, default), default, (default + m // 2) // 2, m // 2})
    parts = [guesses[:0]]
    for rows in counts:
        if out_of_time():
            break
        parts.append(
            _chunked_search(
                geom, guesses, None, config, found, null_step, rows, engine_rows, out_of_time
            )
        )
    return torch.cat(parts)


def _chunked_search(
    geom: SignGeometry,
    starts: torch.Tensor,
    deflation: torch.Tensor | None,
    config: SpearConfig,
    found: torch.Tensor | None,
    null_step: str,
    rows: int | None,
    engine_rows: bool,
    out_of_time: Callable[[], bool],
    whole: bool = False,
) -> torch.Tensor:
    """:func:`sign_search` over chunks of ``starts``, bounded by ``max_elements`` and
    :data:`_CHUNK_WORK`, until the time budget is spent: the points of the chunks run."""
    m, b = geom.left.shape
    per_start = m if whole else (rows or null_step_rows(m, b))
    work = config.sign_iterations * IRLS_STEPS * b * b * (per_start + b)
    chunk = max(1, min(config.max_elements // (per_start * b), int(_CHUNK_WORK // work)))
    parts = []
    for begin in range(0, starts.shape[0], chunk):
        part = starts[begin : begin + chunk]
        parts.append(
            sign_search(
                geom,
                part,
                deflation,
                config.sign_iterations,
                found,
                null_step,
                rows,
                engine_rows,
                whole=whole,
            )
        )
        if out_of_time():
            break
    return torch.cat(parts)


def _complement_round(
    harvest: _Harvester, geom: SignGeometry, generator: torch.Generator, null_step: str
) -> int:
    """Propose the candidates of :func:`complement_columns` from the pool's columns; the
    number of new columns."""
    with harvest.clock.stage("search"):
        points = complement_columns(
            geom,
            geom.to_search(harvest.pool.columns),
            harvest.rule,
            generator,
            null_step,
            engine_rows=harvest.engine_rows,
        )
    return harvest.propose(points)


def _sign_rounds(
    harvest: _Harvester,
    geom: SignGeometry,
    batch_size: int,
    generator: torch.Generator,
    out_of_time: Callable[[], bool],
    null_step: str,
    patience: int | None = None,
) -> tuple[int, int]:
    """Rounds of the sign-consistency search until the pool is full, it stalls (``patience``
    rounds that find nothing, by default the config's), or time is up; the number of rounds
    run and of starts they used."""
    pool, config = harvest.pool, harvest.config
    # Estimated input coordinates of the pool's columns, in pool order (the pool only grows).
    inputs = torch.zeros(0, batch_size, dtype=torch.float64, device=pool.columns.device)
    basis: torch.Tensor | None = None
    idle = rounds = starts_run = 0
    # Columns missing at the last complement round that found nothing: it draws from the
    # complement of the found columns, and with as many missing it is retried only once a
    # quarter of them has been found (m=1000, B=150, past the limit: 6 s of refinement and 10 s
    # of search per round, 580 to 596 candidates and none new, 4 times with 1 to 5 found).
    fruitless = math.inf
    patience = config.sign_patience if patience is None else patience
    while len(pool) < batch_size and idle < patience and not out_of_time():
        with harvest.clock.stage("search"):
            fresh = pool.columns[inputs.shape[0] :]
            if fresh.shape[0]:  # the deflation changes only when the pool grew
                active = ~zero_mask(harvest.left, fresh, harvest.rule)
                inputs = torch.cat([inputs, fit_inputs(geom.affine(), active)[:, :batch_size]])
                basis = deflation_basis(geom.to_search(pool.columns), inputs)
            # Basins of trained networks' columns are very uneven: rounds that find nothing
            # widen the next one, and a success narrows it again.
            widen = min(2**idle, _SIGN_WIDEN_MAX)
            starts = random_starts(config.sign_starts * widen, batch_size, generator)
            found = geom.to_search(pool.columns) if len(pool) else None
            engine_rows = harvest.engine_rows
            points = _chunked_search(
                geom,
                starts,
                basis,
                config,
                found,
                null_step,
                None,
                engine_rows,
                out_of_time,
                whole=_sparse_layer(pool, harvest.left.shape[0]),
            )
            # The guided searches of the last columns cost many rounds' work at large B (at
            # B = 256, m = 4000 one ran 220 s where rounds of random starts found the last 9
            # columns too): they run once random starts stop finding any.
            if (
                basis is not None
                and found is not None
                and idle
                and _few_missing(config, batch_size, len(pool))
            ):
                points = torch.cat(
                    [
                        points,
                        _last_columns(
                            geom,
                            basis,
                            found,
                            config,
                            null_step,
                            generator,
                            engine_rows,
                            out_of_time,
                        ),
                    ]
                )
        grew = harvest.propose(geom.to_engine(points))
        # A round that found nothing: the complement of the found ones holds the missing
        # samples' inputs (see complement_columns). Without noise, not while rounds still find
        # columns: at B=100, m=4000 a round of 8 starts costs 0.15 s and finds the last 5, the
        # complement round 2.5 s. Under noise (and float32 round-off) also once few are
        # missing: there a sign round's mix can pass the noise-level certificate first
        # (a trained float32 client, B=20, m=200: one did, and no sample came back).
        missing = batch_size - len(pool)
        retry = not grew and missing <= _COMPLEMENT_RETRY * fruitless
        few = bool(harvest.rule.noise_std) and _few_missing(config, batch_size, len(pool))
        if len(pool) and (retry or few):
            more = _complement_round(harvest, geom, generator, null_step)
            fruitless = math.inf if more else missing
            grew += more
        idle = 0 if grew else idle + 1
        rounds += 1
        starts_run += int(points.shape[0])  # one point per start, the last columns' included
        log.debug("sign round %d: %d of %d columns", rounds, len(pool), batch_size)
    return rounds, starts_run


def _faint_noise(fac: Factorisation) -> bool:
    """Whether the noise, if any, is too faint to steer the sign search: the weakest sample's
    singular value stands ``_FAINT_NOISE`` times above the noise's edge. Its null steps then
    run on rows of U (see ``sign_search``'s ``engine_rows``).

    Measured: DP-SGD puts the weakest sample 5 to 12 times above the edge at sigma=1e-4, B=20,
    m=200 and 230 to 280 times at sigma=1e-6, B=150, m=4000, where rows of U S keep every
    sample near-exact (on rows of U one of three seeds fell to 15 dB); a float32 client's
    update taken as the float64 difference of its weights, 1,800 to 12,000 times, and once the
    network has trained 300 SGD steps its search on rows of U S found 69.5% of samples
    near-exact (10 seeds), on rows of U 98.5%.
    """
    weakest = float(fac.singular_values[fac.batch_size - 1])
    return not fac.noise_std or weakest >= _FAINT_NOISE * fac.noise_edge


def _budget_clock(kind: str) -> Callable[[], float]:
    """Seconds spent since now, on the clock the time budget counts (see ``budget_clock``)."""
    if kind == "wall":
        origin = time.perf_counter()
        return lambda: time.perf_counter() - origin
    origin = time.process_time()
    threads = max(1, torch.get_num_threads())
    return lambda: (time.process_time() - origin) / threads


def run_spearpp(
    obs: LayerObservation,
    *,
    batch_size: int | None,
    noise_std: float | None,
    config: SpearConfig,
) -> Reconstruction:
    """Reconstruct the batch behind ``obs``; see :func:`attacks.reconstruct`."""
    clock = _Clock()
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    device = obs.grad_weight.device
    with clock.stage("factorise"):
        fac = factorise(
            obs.grad_weight,
            batch_size=batch_size,
            noise_std=noise_std,
            precision=obs.precision,
            generator=generator,
        )
    declared_noise, noise_std = noise_std, fac.noise_std  # declared, or fitted to the spectrum
    b, m = fac.batch_size, obs.width
    # Without noise the bias gradient fixes the scales exactly already.
    next_layer = config.next_layer_scale and obs.next_layer is not None and bool(noise_std)
    null_step = config.null_step
    if null_step == "auto":  # see SpearConfig.null_step
        null_step = "inverse"
    settings = {
        **config.as_dict(),
        "refinement": config.refinement,
        "device_used": str(device),
        "declared_batch_size": batch_size,
        "declared_noise_std": declared_noise,
        "precision": obs.precision,
        "precision_from": obs.precision_from,
        "null_step_used": null_step,
        "scales_from": "this and the next layer's bias gradients"
        if next_layer
        else "bias gradient",
    }
    if b == 0:
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
    left = fac.left
    rule = ZeroRule(
        relative=config.zero_tol or obs.precision,
        # A float32 gradient's round-off is noise to its weak samples' zeros (see
        # Factorisation.roundoff_std): every check works as under noise of that level.
        noise_std=float(noise_std or 0.0) or fac.roundoff_std,
        inverse_singular=1.0 / fac.singular_values[:b],
    )
    pool = ColumnPool(b, device, spares=2 * b, same_cosine=rule.same_column_cosine)
    search_left = left.to(getattr(torch, config.search_dtype))
    harvest = _Harvester(left, search_left, rule, config, pool, clock, generator)
    harvest.engine_rows = _faint_noise(fac)
    harvest.inputs = (fac.right, obs.grad_bias, obs.weight, obs.bias)

    spent = _budget_clock(config.budget_clock)

    def out_of_time() -> bool:
        budget = config.time_budget_s
        return budget is not None and spent() > budget

    sign_rounds = sign_starts = 0
    geom: SignGeometry | None = None
    if config.search == "signs":
        with clock.stage("search"):
            # Under noise the fits stay linear: the halfspace thresholds there
            # (_NOISY_MIN_AGREEMENT) were measured so, and DP sigma=1e-4 fell below 90%
            # near-exact with affine ones.
            bias = None if rule.noise_std else obs.bias
            geom = SignGeometry.build(left, fac.right, obs.weight, bias)
        harvest.pre = geom.affine()
        sign_rounds, sign_starts = _sign_rounds(harvest, geom, b, generator, out_of_time, null_step)
        if _few_missing(config, b, len(pool)):
            _deflate(harvest, b, generator)
        log.info(
            "SPEAR++ sign search: %d of %d columns verified in %d rounds (%.1f s)",
            len(pool),
            b,
            sign_rounds,
            time.perf_counter() - started,
        )
    chunk = max(1, min(config.starts, config.max_elements // m))
    starts = passes = 0
    while passes < config.max_passes and len(pool) < b:
        if out_of_time():
            log.info("time budget of %.0f s spent after %d passes", config.time_budget_s, passes)
            break
        passes += 1
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
            with clock.stage("search"):
                points = run_search(search_left, fresh, config, harvest)
            harvest(points, final=True)
            starts += count
            if len(pool) >= b:
                break
        if _few_missing(config, b, len(pool)):
            _deflate(harvest, b, generator)
            if geom is not None:
                _complement_round(harvest, geom, generator, null_step)
        log.info(
            "SPEAR++ pass %d/%d: %d of %d columns verified (%d starts, %.1f s)",
            passes,
            config.max_passes,
            len(pool),
            b,
            starts,
            time.perf_counter() - started,
        )

    def select_and_solve() -> tuple[int, torch.Tensor, Solution]:
        """The pool's columns, B of them, and the inputs they give."""
        with clock.stage("select"):
            found = len(pool)
            order = pool.zeros.argsort(descending=True)
            if found > b:
                columns, solution = greedy_select(
                    pool.columns[order], b, left, fac.right, obs, rule, config.selection_sweeps
                )
            elif found == b - 1 and harvest.unpinned is not None:
                columns = torch.cat([pool.columns[order], harvest.unpinned.column[None]])
            else:
                columns = complete_basis(pool.columns[order], pool.spares(), b)
        with clock.stage("solve"):
            if found <= b or next_layer:
                solution = solve_inputs(columns, left, fac.right, obs, rule, next_layer)
        return found, columns, solution

    found, columns, solution = select_and_solve()
    # Exact needs every column verified; under noise, or at float32's round-off, columns
    # verified at that level can still be off (16 float32 digits at m=200 verified 16 mixes),
    # so each sample's inactive neurons must also match its gradient's zeros. (At float64's
    # round-off the certificate is exact already, and multi-step updates legitimately match
    # less: their zeros are those shared by every local step.)
    coarse = bool(noise_std) or obs.precision >= FLOAT32_PRECISION
    repairs = 0
    while (
        coarse
        and geom is not None
        and found >= b
        and 0 < int((solution.matching < _EXACT_MATCHING).sum()) <= _MIX_SUSPECTS
        and repairs < _REPAIRS
        and not out_of_time()
    ):
        # A full pool whose samples do not all match holds a mix that passed the noise-level
        # certificate: evict it and the samples it corrupts, and search on (DP sigma=1e-6,
        # B=150, m=4000: one mix, two samples under 0.95, 149 of 150 near-exact).
        repairs += 1
        _evict_mismatched(pool, columns, solution.matching < _EXACT_MATCHING)
        harvest.reopen()
        more_rounds, more_starts = _sign_rounds(
            harvest, geom, b, generator, out_of_time, null_step, _REPAIR_PATIENCE
        )
        sign_rounds, sign_starts = sign_rounds + more_rounds, sign_starts + more_starts
        if _few_missing(config, b, len(pool)):
            _deflate(harvest, b, generator)
        again = select_and_solve()
        if again[0] < b or float(again[2].matching.min()) <= float(solution.matching.min()):
            break  # no better: keep what the search had before
        found, columns, solution = again
    # Harvests inside the search were timed under both stages: report them under refine only.
    clock.seconds["search"] = clock.seconds.get("search", 0.0) - harvest.midway_seconds
    verified = torch.zeros(b, dtype=torch.bool)
    verified[: min(found, b)] = True
    agree = _agreeing(solution, columns, left, obs, rule)
    if coarse and found >= b and not bool(agree.all()):
        # Weak samples' columns, estimated from zero sets the noise blurs, can sit off their
        # inputs' inactive neurons while every input is exact (float32, 100 SGD steps, B=32,
        # m=256: 2 of 20 batches). Refitted to those neurons and solved again, the batch counts
        # only if every sample then agrees.
        with clock.stage("solve"):
            refitted = refit_to_inputs(columns, ~agree, solution.inputs, left, obs, rule)
            resolved = solve_inputs(refitted, left, fac.right, obs, rule, next_layer)
        if bool(_agreeing(resolved, refitted, left, obs, rule).all()):
            columns, solution, agree = refitted, resolved, torch.ones_like(agree)
    matched = not coarse or bool(agree.all())
    stray = stray_zeros(columns, solution.inputs, left, obs, rule)
    # A mix put in one sample's place corrupts another sample's input (a row of Q^-1), so one
    # inconsistent sample withdraws every column-based certificate of the batch.
    consistent = bool((stray <= STRAY_MAX).all())
    exact = found >= b and matched and consistent
    inputs, certified = solution.inputs, torch.full((b,), exact, dtype=torch.bool)
    confidence, settled = solution.matching, 0
    if not exact and found == b - 1 and harvest.unpinned is not None and not coarse:
        # Every sample is fixed but those whose columns share the last one's zeros, which the
        # next layer's gradient fixes where it is given. (At float32's round-off or under
        # noise the found columns are not certain enough to vouch for samples this way.)
        doubtful = (columns @ harvest.unpinned.uncertain.T).abs().amax(dim=1) >= _SAME_DIRECTION
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
    clock.seconds["total"] = time.perf_counter() - started
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
            "starts": starts + sign_starts,
            "sign_rounds": sign_rounds,
            "passes": passes,
            "candidates": harvest.proposed,
            "unique": found,
            "selected": min(found, b),
            "settled_last": harvest.settled_last,
            "unpinned_last": int(harvest.unpinned is not None),
            "next_layer_settled": settled,
            "repairs": repairs,
        },
        settings=settings,
        reason=""
        if exact
        else (
            f"not identifiable from this update: all {b} columns verified, but "
            f"{int((stray > STRAY_MAX).sum())} samples' zeros fall on neurons their inputs "
            f"activate at the sent weights (up to {float(stray.max()):.2f} of them), as a mix "
            "of columns does where the output gradients are dependent (few classes above one "
            "hidden layer), or local training that drifted far from the sent weights; nothing "
            "is certified"
            if mixed
            else f"{min(found, b)} of {b} columns verified, {int(certified.sum())} samples "
            f"certified, lowest sparsity matching {float(confidence.min()):.3f}"
            + (
                f"; the last sample's input is exact, but {int((~certified).sum())} samples' "
                "inputs are not: the last column's zeros are theirs too, "
                + (
                    "and the next layer's gradient did not fix them"
                    if obs.next_layer is not None
                    else "and the next layer's gradient was not given"
                )
                if found == b - 1 and harvest.unpinned is not None and not coarse
                else ""
            )
        ),
        **fac.report(),
    )
