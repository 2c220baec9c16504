"""One reconstruction as a picklable job for an attack worker process.

The worker sees only what the job carries: the server's view of the update and the knowledge
the scenario lets the attacker use. Ground truth never enters an attack job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attacks import AttackInputError, AttackPlugin, ServerView
from fl_sim.executors.budget import peak_rss_bytes, reset_peak_rss
from fl_sim.rundir import write_npz


@dataclass(frozen=True)
class AttackJob:
    """One reconstruction: where its arrays are, the attack and its settings, and its key.

    The arrays (the server's weights and the update as a gradient, float64) travel as an .npz
    file, not through the worker pool's pipe: a pipe clogged with megabytes of pending jobs
    would hang the pool's shutdown. ``view`` holds everything else the attacker may use.

    Attributes
    ----------
    server_round, client
        Whose update.
    run
        The record's label: the attack's name, with the loss for the inversion attack
        (``spearpp``, ``inversion-cosine``, ...).
    attack
        The attack's plugin (``attacks.ATTACKS[name]``): it travels with the job, so a worker
        runs attacks registered outside :mod:`attacks.plugins` too (its class is imported by
        name where the job is unpickled).
    arrays
        Path of the .npz (see :func:`write_arrays`).
    view
        The server's view, its ``weights`` and ``gradient`` left empty.
    config
        The attack's settings.
    peak_bytes
        The attack's estimate of its peak memory on these arrays, above an idle worker's.
    """

    server_round: int
    client: int
    run: str
    attack: AttackPlugin
    arrays: str
    view: ServerView
    config: Any
    peak_bytes: int

    def execute(self) -> AttackOutcome:
        """Run the attack; an input the attack refuses becomes an outcome with its reason."""
        start = time.perf_counter()
        reset_peak_rss()
        weights, gradient = read_arrays(self.arrays)
        view = dataclasses.replace(self.view, weights=weights, gradient=gradient)
        try:
            rec = self.attack.reconstruct(view, self.config)
        except AttackInputError as err:
            estimated = getattr(err, "batch_size_estimated", None)
            return AttackOutcome(
                self.server_round,
                self.client,
                None,
                {} if estimated is None else {"batch_size_estimated": estimated},
                f"refused: {err}",
                time.perf_counter() - start,
                memory_peak_bytes=peak_rss_bytes(),
            )
        return AttackOutcome(
            self.server_round,
            self.client,
            rec.inputs.numpy(),
            rec.summary(),
            None,
            time.perf_counter() - start,
            rec.certified.numpy(),
            peak_rss_bytes(),
        )


def write_arrays(
    path: Path, weights: Mapping[str, np.ndarray], gradient: Mapping[str, np.ndarray]
) -> str:
    """Store a job's arrays (``weight:KEY``, ``gradient:KEY``); returns the path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {f"weight:{k}": v for k, v in weights.items()}
    arrays |= {f"gradient:{k}": v for k, v in gradient.items()}
    write_npz(path, arrays)
    return str(path)


def read_arrays(path: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Inverse of :func:`write_arrays`: the weights and the gradient by key."""
    weights: dict[str, np.ndarray] = {}
    gradient: dict[str, np.ndarray] = {}
    with np.load(path) as f:
        for name in f.files:
            kind, _, key = name.partition(":")
            (weights if kind == "weight" else gradient)[key] = f[name]
    return weights, gradient


@dataclass(frozen=True)
class AttackOutcome:
    """What came back: the reconstruction and its summary, or why there is none; ``certified``
    marks the reconstructed samples the attack vouches for (``None`` without a reconstruction);
    ``memory_peak_bytes`` is the worker's peak resident memory during the job (None where the
    system does not say)."""

    server_round: int
    client: int
    inputs: np.ndarray | None
    summary: dict[str, Any]
    error: str | None
    seconds: float
    certified: np.ndarray | None = None
    memory_peak_bytes: int | None = None
