"""The SPEAR++ search's harvest: points of the search refined into verified pool columns, the
last columns settled in closed form where the pool lacks only those, and the seconds each stage
took."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from attacks.spearpp.config import SpearConfig
from attacks.spearpp.last_column import LastColumn, last_column, noisy_last_column
from attacks.spearpp.last_pair import last_pair
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.refine import pin_rows, refine_kernel, refiner
from attacks.spearpp.signs import halfspace_agreement
from attacks.spearpp.zero_rule import ZeroRule, zero_mask

# A live point is worth refining once its pin_rows-th smallest |L q| is this far below the
# median: unconverged directions sit near 0.1, converged ones below 1e-3.
_CONVERGED_RATIO = 1e-2
# At the end of a pass every point but the clearly unconverged ones is refined.
_FINAL_RATIO = 0.1
# Under declared noise, a verified candidate must also agree with a halfspace pattern on this
# share of rows: measured on DP sigma=1e-4, B=20, m=200, true columns scored 0.93 to 0.99 and the
# mixes that passed the noise-level certificate at most 0.90.
_NOISY_MIN_AGREEMENT = 0.92
# Under noise, share of rows on which the last column's zeros must match the inactive neurons
# its closed form predicts (see noisy_last_column): the true column matched 99 of 100 at
# B=8, m=100 under SecAgg+'s quantisation, one zero just past the noise tolerance.
_LAST_MATCH = 0.95


class Clock:
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


def converged(points: torch.Tensor, left: torch.Tensor, rows: int, ratio: float) -> torch.Tensor:
    y = (points @ left.T).abs()
    kth = y.kthvalue(min(rows, y.shape[1]), dim=1).values
    return kth <= ratio * y.median(dim=1).values


class Harvester:
    """Turns points of the search into pool columns, and counts what it saw."""

    def __init__(
        self,
        left: torch.Tensor,
        search_left: torch.Tensor,
        rule: ZeroRule,
        config: SpearConfig,
        pool: ColumnPool,
        clock: Clock,
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
        # the engine (see rounds.faint_noise).
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
            ready = converged(points, self.search_left, self.rows, ratio)
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
