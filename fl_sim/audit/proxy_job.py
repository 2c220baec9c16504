"""The judge's own worker job: each sample's vulnerability proxies at its ground truth.

It runs in the attack workers' pool (the work is of the same size) but is no attack: it holds
the true inputs and labels, and nothing of it is handed to one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fl_sim.forecast import sample_proxies


@dataclass(frozen=True)
class ProxyJob:
    """Proxies of one client's batch of one round.

    Attributes
    ----------
    server_round, client
        Whose batch.
    arrays
        .npz with ``weight:KEY`` (every array as the server sent it), ``inputs`` (the batch as
        the model took it, B x ...), ``labels`` and ``ids``.
    architecture
        The model (weights not used).
    tol, max_iter
        Lanczos tolerance and cap.
    seed
        Seeds the Lanczos starts.
    peak_bytes
        Estimated peak memory above an idle worker's (:func:`proxy_peak_bytes`).
    """

    server_round: int
    client: int
    arrays: str
    architecture: nn.Module
    tol: float
    max_iter: int
    seed: int
    peak_bytes: int

    def execute(self) -> ProxyOutcome:
        """Compute every sample's proxies, in float64, on the CPU."""
        start = time.perf_counter()
        with np.load(self.arrays) as f:
            weights = {
                n.partition(":")[2]: torch.from_numpy(f[n])
                for n in f.files
                if n.startswith("weight:")
            }
            inputs, labels, ids = f["inputs"], f["labels"], f["ids"]
        samples = []
        for i, (x, y, sample_id) in enumerate(zip(inputs, labels, ids, strict=True)):
            proxies = sample_proxies(
                self.architecture,
                weights,
                torch.from_numpy(x),
                int(y),
                tol=self.tol,
                max_iter=self.max_iter,
                seed=self.seed + i,
            )
            samples.append(
                {
                    "id": int(sample_id),
                    "label": int(y),
                    **proxies.values(),
                    "iterations": proxies.iterations,
                    "converged": proxies.converged,
                }
            )
        return ProxyOutcome(
            self.server_round, self.client, samples, None, time.perf_counter() - start
        )


# Copies of the model a sample's proxies hold at once: its weights, the gradient, the graph of
# the Hessian-vector products and the Lanczos vectors (a rough bound, not measured).
PROXY_MODEL_COPIES = 8
FLOAT64_BYTES = 8


def proxy_peak_bytes(weights: dict[str, np.ndarray], inputs: np.ndarray) -> int:
    """Estimated peak of a proxy job over the model ``weights`` and the batch ``inputs``."""
    model = sum(int(np.size(w)) for w in weights.values()) * FLOAT64_BYTES
    return PROXY_MODEL_COPIES * model + 2 * int(np.size(inputs)) * FLOAT64_BYTES


def write_proxy_arrays(
    path: Path,
    weights: dict[str, np.ndarray],
    inputs: np.ndarray,
    labels: np.ndarray,
    ids: np.ndarray,
) -> str:
    """Store a proxy job's arrays; returns the path as a string."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {f"weight:{k}": v for k, v in weights.items()}
    np.savez(path, inputs=inputs, labels=labels, ids=ids, **arrays)
    return str(path)


@dataclass(frozen=True)
class ProxyOutcome:
    """Per sample: id, label and every proxy (or why there are none)."""

    server_round: int
    client: int
    samples: list[dict[str, Any]]
    error: str | None
    seconds: float
