"""The analytic attack: each sample a first-layer neuron fires for alone, read off the update
exactly, x_i = dL/dW_j / dL/db_j (:func:`attacks.spearpp.isolate.isolated_samples`), and
nothing else.

It needs no search and no batch size: what it returns is certified (at least two neurons agree
on each sample). On an honest model such neurons are rare; a server that lays trap weights
makes them the rule, and this attack is what it runs.
"""

from __future__ import annotations

import time

import torch
from pydantic import BaseModel, ConfigDict

from attacks.result import Reconstruction
from attacks.spearpp.inputs import LayerObservation
from attacks.spearpp.isolate import isolated_samples


class AnalyticConfig(BaseModel):
    """``seed``: seeds the random sketch that finds agreeing neurons."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 0


def run_analytic(obs: LayerObservation, config: AnalyticConfig) -> Reconstruction:
    """The samples isolated neurons give away (c x n: c is however many there are)."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(config.seed)
    found = isolated_samples(obs.grad_weight, obs.grad_bias, obs.precision, generator)
    c = found.shape[0]
    return Reconstruction(
        inputs=found.cpu(),
        batch_size=c,
        batch_size_method="isolated neurons",
        status="partial" if c else "failed",
        confidence=torch.ones(c, dtype=torch.float64),
        verified=torch.zeros(c, dtype=torch.bool),
        certified=torch.ones(c, dtype=torch.bool),
        timings={"total": time.perf_counter() - started},
        counts={"isolated": c},
        settings={"seed": config.seed},
        reason="" if c else "no sample is isolated by two neurons",
    )
