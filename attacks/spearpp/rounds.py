"""The SPEAR++ search's rounds: sign-consistency rounds until the pool is full or they stall,
the guided searches of the last few columns, the convex searches that deflate the found ones,
and the clock the time budget counts."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import torch

from attacks.spearpp.complement import complement_columns
from attacks.spearpp.config import SpearConfig
from attacks.spearpp.coupled import Coupling, coupled_search, coupled_turn
from attacks.spearpp.deflate import complement_probes, l1_on_hyperplanes
from attacks.spearpp.factor import Factorisation
from attacks.spearpp.found_inputs import FoundInputs
from attacks.spearpp.harvest import Harvester
from attacks.spearpp.hidden import NextBases
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.search import random_starts
from attacks.spearpp.signs import (
    FREE_ITERATIONS,
    IRLS_STEPS,
    SignGeometry,
    null_step_rows,
    sign_search,
)

log = logging.getLogger(__name__)

# Convex trials per deflation round beyond two per missing column.
_DEFLATE_EXTRA = 4
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
# Share of a sample's estimated zeros that the null steps take where the default takes more
# rows than it has (see few_zero_rows).
_FEW_ZEROS_SHARE = 0.6
# Noise whose edge lies this far below the weakest sample's singular value does not steer the
# sign search (see faint_noise).
_FAINT_NOISE = 1000.0


def _sparse_layer(pool: ColumnPool, m: int) -> bool:
    """Whether the columns found so far are mostly zeros (see ``sign_search``'s ``whole``)."""
    return bool(len(pool)) and float(pool.zeros.double().median()) > _SPARSE_LAYER * m


def few_zero_rows(live: int, b: int, silent: int) -> int | None:
    """Rows per null step (on the live rows; under noise on every row too: see ``search_signs``)
    for a layer of ``live`` neurons some sample fired and ``silent`` that none did, where the
    default takes more rows than a sample leaves inactive among the live ones:
    ``_FEW_ZEROS_SHARE`` of them, at least B - 1 (a null direction); ``None`` where the
    default fits.

    A true column is a fixed point of the sign search only if the rows its fitted pattern
    rates most inactive are all zeros of it. Silent neurons mark inputs that share a dominant
    component ([0, 1] pixels), which about as many neurons meet by firing for every sample;
    the rest fire for about half the samples, so a sample leaves about (live - silent) / 2 live
    neurons inactive (m=200, B=20: 45 silent, 57 of the 155 live ones always firing, 45 to 58
    zeros a sample, 55 estimated; B=30: 52 to 68, 57 estimated; m=1000, B=150: 395 to 448,
    429 estimated). The default's 60 rows left no true column of that B=20 batch reachable
    (seed 1: 4 of 20 columns); the B=30 batch (seed 2) came back whole on 30 or 34 rows, on
    none of 40, 45 or 50. Where the default fits it is kept: large batches need many rows
    (centred, B=150, m=1000: 300 rows found all columns on 1 seed of 3, 450 rows on 2; [0, 1]
    pixels, B=125, m=1000, seed 1: 375 rows against 406 zeros estimated, 372 to 427 true;
    half the default found 50 of 125 columns in 190 s where the default found all).
    """
    default = null_step_rows(live, b)
    zeros = (live - silent) / 2
    if default <= zeros:
        return None
    return min(default, max(b - 1, int(_FEW_ZEROS_SHARE * zeros)))


def few_missing(config: SpearConfig, batch_size: int, found: int) -> bool:
    """Whether the convex searches for the last columns are worth running now."""
    missing = batch_size - found
    return config.deflate and 0 < missing <= max(_DEFLATE_MAX_MISSING, batch_size // 20)


def deflate(harvest: Harvester, batch_size: int, generator: torch.Generator) -> None:
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
    free_iterations: int = FREE_ITERATIONS,
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
                free_iterations=free_iterations,
            )
        )
        if out_of_time():
            break
    return torch.cat(parts)


def complement_round(
    harvest: Harvester, geom: SignGeometry, generator: torch.Generator, null_step: str
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


def round_starts(
    geom: SignGeometry, count: int, generator: torch.Generator, noiseless: bool
) -> torch.Tensor:
    """``count`` random starts of a sign round (search coordinates): uniform on the sphere of
    the search's coordinates, and for a ``noiseless`` gradient half of them uniform on the
    sphere of the engine's coordinates (v = S q) instead.

    A point's labels are the sizes of L q = U S q, so a step of a few degrees in the search's
    coordinates swamps a weak sample's column, and starts uniform there land near the
    strongest samples' columns. On a memorised network (m=1000, B=150, its own images, the
    samples' shares of the gradient spanning 1 to 1e-10), from 2 degrees off in the search's
    coordinates 18 of the 40 strongest columns came back and none of the other 101; from 20
    degrees off in the engine's, every fixed point, whatever its share. Its saved update's
    rounds found 104 of 141 columns in 300 s of CPU with search-uniform starts, 141 with
    engine-uniform ones (256 s) and 137 by round 52 with half of each. All engine-uniform
    starts cost a small layer its certificates (n=20, m=80, 3 classes, B=12, 20 seeds: 10
    samples exact and none certified, where search-uniform starts got 14 and 12; half of each
    25 and 24). Noisy gradients keep search-uniform starts: their weakest directions are the
    noisiest (a float32 client's update as the float64 difference of its weights, noise too
    faint to leave the rows of U: seed 5 fell under 85% near-exact with them).
    """
    starts = random_starts(count, geom.left.shape[1], generator)
    if not noiseless:
        return starts
    half = count // 2
    return torch.cat([geom.to_search(starts[:half]), starts[half:]])


def sign_rounds(
    harvest: Harvester,
    geom: SignGeometry,
    batch_size: int,
    generator: torch.Generator,
    out_of_time: Callable[[], bool],
    null_step: str,
    patience: int | None = None,
    hidden: NextBases | None = None,
    few_rows: int | None = None,
    coupling: Coupling | None = None,
) -> tuple[int, int]:
    """Rounds of the sign-consistency search until the pool is full, it stalls (``patience``
    rounds that find nothing, by default the config's), or time is up; the number of rounds
    run and of starts they used. ``hidden``, the next layer's row space on the geometry's rows
    (see :mod:`attacks.spearpp.hidden`), gives the found samples' input coordinates where it
    holds their hidden vectors. With ``few_rows`` (see :func:`few_zero_rows`)
    the null steps start on that many rows, and every idle round switches between them and the
    default. With ``coupling`` (:func:`attacks.spearpp.coupled.coupling` on the geometry's
    rows) each round adds the config's ``coupled_starts`` points of the coupled search."""
    pool, config = harvest.pool, harvest.config
    found_inputs = FoundInputs(harvest, geom, hidden, batch_size)
    idle = rounds = starts_run = 0
    # Columns missing at the last complement round that found nothing: it draws from the
    # complement of the found columns, and with as many missing it is retried only once a
    # quarter of them has been found (m=1000, B=150, past the limit: 6 s of refinement and 10 s
    # of search per round, 580 to 596 candidates and none new, 4 times with 1 to 5 found).
    fruitless = math.inf
    patience = config.sign_patience if patience is None else patience
    # Rows per null step: the default, or first the fewer of few_zero_rows, switched after
    # every idle round and kept while it finds columns.
    rows_options = (few_rows, None)
    shrunk = sign_yield = 0
    # Coupled points per round, as a multiple of the config's: doubled after each round in
    # which they found columns at a better rate than the sign starts, back to one otherwise.
    coupled_widen = 1
    # Columns a second (search and refinement) of each kind's last turn.
    sign_rate = coupled_rate = 0.0
    while len(pool) < batch_size and idle < patience and not out_of_time():
        with harvest.clock.stage("search"):
            begin = time.perf_counter()
            found_inputs.update()
            basis = found_inputs.basis
            # Basins of trained networks' columns are very uneven: rounds that find nothing
            # widen the next one, and a success narrows it again.
            widen = min(2**idle, _SIGN_WIDEN_MAX)
            engine_rows = harvest.engine_rows
            noiseless = not harvest.rule.noise_std
            starts = round_starts(geom, config.sign_starts * widen, generator, noiseless)
            found = geom.to_search(pool.columns) if len(pool) else None
            # Once every found sample's coordinates are exact (from the next layer) the
            # complement holds just the missing columns: no free iterations, whose points fall
            # back into found columns' basins (a converged network, m=1000, B=150, the 14
            # columns with fewest zeros missing: 0 of 14 from 64 starts with them; the rounds
            # found 136 of 150 with them, all in 6 to 7 s without; [0, 1] pixels, B=100,
            # m=1000: 3 s where 26 s). On 3 rows per missing column instead of the default,
            # [0, 1] pixels at B=50 stopped at 43 of 50.
            free = 0 if found_inputs.exact and basis is not None else FREE_ITERATIONS
            points = _chunked_search(
                geom,
                starts,
                basis,
                config,
                found,
                null_step,
                rows_options[shrunk],
                engine_rows,
                out_of_time,
                whole=_sparse_layer(pool, harvest.left.shape[0]),
                free_iterations=free,
            )
            coupled = None
            sign_seconds = time.perf_counter() - begin
            coupled_seconds = 0.0
            if (
                coupling is not None
                and config.coupled_starts
                and rounds
                and coupled_turn(
                    sign_yield, sign_rate, coupled_rate, bool(harvest.rule.noise_std), idle
                )
                and not out_of_time()
            ):
                begin = time.perf_counter()
                coupled = coupled_search(
                    geom,
                    coupling.deflated(found_inputs.hidden()) if found_inputs.exact else coupling.k,
                    config.coupled_starts * coupled_widen,
                    basis,
                    found,
                    generator,
                    out_of_time,
                    found_inputs.exact,
                    coupling.dtype,
                )
                coupled_seconds = time.perf_counter() - begin
            # The guided searches of the last columns cost many rounds' work at large B (at
            # B = 256, m = 4000 one ran 220 s where rounds of random starts found the last 9
            # columns too): they run once random starts stop finding any.
            begin = time.perf_counter()
            if (
                basis is not None
                and found is not None
                and idle
                and few_missing(config, batch_size, len(pool))
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
        grew = sign_yield = harvest.propose(geom.to_engine(points))
        sign_rate = sign_yield / (sign_seconds + time.perf_counter() - begin)
        if coupled is not None:
            begin = time.perf_counter()
            coupled_yield = harvest.propose(geom.to_engine(coupled))
            coupled_rate = coupled_yield / (coupled_seconds + time.perf_counter() - begin)
            grew += coupled_yield
            starts_run += int(coupled.shape[0])
            # Where the coupled points find columns faster, each round's fixed costs (its sign
            # starts, the found inputs' fits) are spread over more of them: at B=512, m=4000
            # at initialisation 8 a round found 58 columns in 17 rounds of 1200 s.
            widen_coupled = coupled_yield and coupled_rate >= sign_rate
            coupled_widen = min(2 * coupled_widen, _SIGN_WIDEN_MAX) if widen_coupled else 1
        # A round that found nothing: the complement of the found ones holds the missing
        # samples' inputs (see complement_columns). Without noise, not while rounds still find
        # columns: at B=100, m=4000 a round of 8 starts costs 0.15 s and finds the last 5, the
        # complement round 2.5 s. Under noise (and float32 round-off) also once few are
        # missing: there a sign round's mix can pass the noise-level certificate first
        # (a trained float32 client, B=20, m=200: one did, and no sample came back).
        missing = batch_size - len(pool)
        retry = not grew and missing <= _COMPLEMENT_RETRY * fruitless
        few = bool(harvest.rule.noise_std) and few_missing(config, batch_size, len(pool))
        if len(pool) and (retry or few):
            more = complement_round(harvest, geom, generator, null_step)
            fruitless = math.inf if more else missing
            grew += more
        idle = 0 if grew else idle + 1
        shrunk = shrunk if grew else 1 - shrunk
        rounds += 1
        starts_run += int(points.shape[0])  # one point per start, the last columns' included
        log.debug(
            "sign round %d: %d of %d columns (%d coupled points)",
            rounds,
            len(pool),
            batch_size,
            0 if coupled is None else coupled.shape[0],
        )
    return rounds, starts_run


def faint_noise(fac: Factorisation) -> bool:
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


def budget_clock(kind: str) -> Callable[[], float]:
    """Seconds spent since now, on the clock the time budget counts (see ``budget_clock``)."""
    if kind == "wall":
        origin = time.perf_counter()
        return lambda: time.perf_counter() - origin
    origin = time.process_time()
    threads = max(1, torch.get_num_threads())
    return lambda: (time.process_time() - origin) / threads
