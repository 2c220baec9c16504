"""SPEAR++ end to end: factor, search, refine, pool, select, scale, solve, certify.

Each stage is a function over one :class:`~attacks.spearpp.state.SpearState`
(:mod:`attacks.spearpp.stages`, the certificate in :mod:`attacks.spearpp.certify`); this module
says their order, which the generator's draws follow.
"""

from __future__ import annotations

import time

import torch

from attacks.errors import NotLowRankError
from attacks.result import Reconstruction
from attacks.spearpp import stages
from attacks.spearpp.certify import certified
from attacks.spearpp.config import SpearConfig
from attacks.spearpp.factor import factorise
from attacks.spearpp.harvest import Clock
from attacks.spearpp.inputs import LayerObservation


def run_spearpp(
    obs: LayerObservation,
    *,
    batch_size: int | None,
    noise_std: float | None,
    config: SpearConfig,
) -> Reconstruction:
    """Reconstruct the batch behind ``obs``; see :func:`attacks.reconstruct`."""
    clock = Clock()
    started = time.perf_counter()
    silent = obs.silent
    live = obs.width - int(silent.sum())
    generator = torch.Generator().manual_seed(config.seed)
    with clock.stage("factorise"):
        try:
            fac = factorise(
                obs.grad_weight,
                batch_size=batch_size,
                noise_std=noise_std,
                precision=obs.precision,
                generator=generator,
            )
        except NotLowRankError as error:  # say how many neurons were silent
            raise NotLowRankError(
                error.batch_size_estimated, error.method, live, error.n, int(silent.sum())
            ) from None
    if fac.batch_size >= min(live, obs.input_dim):
        # Full rank on the neurons that carry a gradient (a top-k client's update): the silent
        # ones make it look low-rank, not the batch.
        raise NotLowRankError(fac.batch_size, fac.method, live, obs.input_dim, int(silent.sum()))
    chosen = stages.settings_of(obs, config, fac, batch_size, noise_std, int(silent.sum()))
    if fac.batch_size == 0:
        return stages.nothing_to_attack(obs, fac, clock, started, chosen[0])
    state = stages.prepared(obs, config, fac, clock, generator, started, chosen)
    if config.search == "signs":
        stages.search_signs(state)
    stages.search_passes(state)
    stages.select_and_solve(state)
    stages.repair(state)
    return certified(state)
