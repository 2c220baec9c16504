"""One reconstruction as a picklable job for an attack worker process.

The worker sees only what the job carries: the server's view of the layer and the knowledge the
scenario lets the attacker use. Ground truth never enters a job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from attacks import AttackInputError, SpearConfig, reconstruct


@dataclass(frozen=True)
class AttackJob:
    """Inputs of one reconstruction (float64 arrays) and the key it is filed under."""

    server_round: int
    client: int
    grad_weight: np.ndarray
    grad_bias: np.ndarray
    weight: np.ndarray
    bias: np.ndarray
    batch_size: int | None
    noise_std: float | None
    config: SpearConfig


@dataclass(frozen=True)
class AttackOutcome:
    """What came back: the reconstruction and its summary, or why there is none."""

    server_round: int
    client: int
    inputs: np.ndarray | None
    summary: dict[str, Any]
    error: str | None
    seconds: float


def run_job(job: AttackJob) -> AttackOutcome:
    """Run SPEAR++ on a job; an input the attack refuses becomes an outcome with its reason."""
    start = time.perf_counter()
    try:
        rec = reconstruct(
            job.grad_weight,
            job.grad_bias,
            job.weight,
            job.bias,
            batch_size=job.batch_size,
            noise_std=job.noise_std,
            config=job.config,
        )
    except AttackInputError as err:
        return AttackOutcome(
            job.server_round, job.client, None, {}, f"refused: {err}", time.perf_counter() - start
        )
    return AttackOutcome(
        job.server_round,
        job.client,
        rec.inputs.numpy(),
        rec.summary(),
        None,
        time.perf_counter() - start,
    )
