"""One reconstruction as a picklable job for an attack worker process.

The worker sees only what the job carries: the server's view of the layer and the knowledge the
scenario lets the attacker use. Ground truth never enters a job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attacks import AttackInputError, SpearConfig, reconstruct


@dataclass(frozen=True)
class AttackJob:
    """One reconstruction: where its arrays are, what the attacker may know, and its key.

    The arrays (``grad_weight``, ``grad_bias``, ``weight``, ``bias``, float64) travel as an
    .npz file, not through the worker pool's pipe: a pipe clogged with megabytes of pending
    jobs would hang the pool's shutdown.
    """

    server_round: int
    client: int
    arrays: str
    batch_size: int | None
    noise_std: float | None
    config: SpearConfig


ARRAY_NAMES = ("grad_weight", "grad_bias", "weight", "bias")


def write_arrays(
    path: Path,
    grad_weight: np.ndarray,
    grad_bias: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
) -> str:
    """Store a job's arrays; returns the path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, grad_weight=grad_weight, grad_bias=grad_bias, weight=weight, bias=bias)
    return str(path)


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
    with np.load(job.arrays) as f:
        arrays = {name: f[name] for name in ARRAY_NAMES}
    try:
        rec = reconstruct(
            **arrays,
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
