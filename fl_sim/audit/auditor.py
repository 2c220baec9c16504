"""The judge at work during a run: every intercepted update becomes an attack job beside the
federation, and every finished job one line of ``audit.jsonl``, written as soon as it is known.

Ground truth (which samples a client trained on) enters only here, after the attack returned.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks import SpearConfig
from fl_sim.apps.recorder import append_jsonl
from fl_sim.audit.executors import make_executor
from fl_sim.audit.grid import save_grid
from fl_sim.audit.job import AttackJob, AttackOutcome, write_arrays
from fl_sim.audit.metrics import match_and_score
from fl_sim.config.cluster import ClusterSpec
from fl_sim.config.schema import AuditSpec
from fl_sim.data.federated import FederatedData
from strategies import InterceptedUpdate, update_as_gradient

log = logging.getLogger(__name__)

AUDIT_FILE = "audit.jsonl"
UPDATES_DIR = "updates"
# Job inputs on their way to the attack workers; removed once judged.
JOBS_DIR = "jobs"
# Every record carries these (None where no reconstruction was scored).
METRIC_KEYS = (
    "batch_size_estimated", "psnr_mean", "psnr_min", "share_exact", "share_near_exact",
    "ssim_mean", "seconds",
)  # fmt: skip
GRID_DIR = "grids"


def attack_config(spec: AuditSpec, seed: int) -> SpearConfig:
    """The SPEAR++ settings an audit uses."""
    return SpearConfig(
        starts=spec.starts,
        steps=spec.steps,
        max_passes=spec.max_passes,
        time_budget_s=spec.time_budget_s,
        seed=seed,
    )


def _name(base: Mapping[str, Any], suffix: str) -> str:
    return f"r{base['round']:03d}-c{base['client']:03d}{suffix}"


def save_update(update: InterceptedUpdate, path: Path) -> None:
    """Store an intercepted update (arrays as received, declarations as JSON)."""
    assert update.weight is not None and update.bias is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        sent_weight=update.sent_weight,
        sent_bias=update.sent_bias,
        weight=update.weight,
        bias=update.bias,
        meta=np.asarray(
            json.dumps(
                {
                    "server_round": update.server_round,
                    "node_id": update.node_id,
                    "declared": dict(update.declared),
                    "audit": dict(update.audit),
                }
            )
        ),
    )


def load_update(path: Path) -> InterceptedUpdate:
    """Inverse of :func:`save_update`."""
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
        return InterceptedUpdate(
            server_round=meta["server_round"],
            node_id=meta["node_id"],
            declared=meta["declared"],
            sent_weight=f["sent_weight"],
            sent_bias=f["sent_bias"],
            weight=f["weight"],
            bias=f["bias"],
            audit=meta["audit"],
        )


def rounding_noise(received: np.ndarray, lr: float) -> float:
    """Per-entry std of (sent - received) / lr due to rounding ``received`` to its dtype, for
    one local step (each step rounds again: the caller scales by sqrt(steps)).

    Rounding to nearest errs uniformly within half a unit in the last place: std ulp / sqrt(12).
    Zero for float64 weights, whose round-off sits below the attack's own tolerance.
    """
    if received.dtype == np.float64:
        return 0.0
    ulp = np.spacing(np.abs(received)).astype(np.float64)
    return float(np.sqrt(np.mean(ulp**2) / 12.0)) / lr


class Auditor:
    """Sink of the honest-but-curious strategy, and the judge of what its attacks recover.

    Parameters
    ----------
    spec
        What to attack, with which knowledge and budget.
    data
        The run's data: only for judging (ground truth), never for attacking.
    run_dir
        Where ``audit.jsonl`` and ``grids/`` grow.
    seed
        Seeds the attacks.
    cluster
        Where the attacks run: its ``attack_executor`` with ``spec.workers`` attacks at once
        (default: a local pool of that many processes).
    """

    def __init__(
        self,
        spec: AuditSpec,
        data: FederatedData,
        run_dir: Path,
        seed: int,
        cluster: ClusterSpec | None = None,
    ) -> None:
        self.spec = spec
        self.data = data
        self.run_dir = run_dir
        self.seed = seed
        cluster = cluster or ClusterSpec()
        self._executor = make_executor(cluster.attack_executor, spec.workers, cluster)
        self._lock = threading.Lock()
        # Records still to come, by (round, client).
        self._pending: dict[tuple[int, int], dict[str, Any]] = {}

    def __call__(self, update: InterceptedUpdate) -> None:
        """File an update: rejected at once if unusable, else queued for attack."""
        base = self._base(update)
        if self.spec.keep_updates and update.problem is None:
            save_update(update, self.run_dir / UPDATES_DIR / _name(base, ".npz"))
        if update.problem is not None:
            self._write({**base, "status": "rejected", "reason": update.problem})
            return
        if not self._targeted(base["round"], base["client"]):
            return
        job, knowledge = self._job(update, base)
        base["knowledge"] = knowledge
        with self._lock:  # before submitting: the outcome may come back at once
            self._pending[(base["round"], base["client"])] = base
        # Only the sample ids wait for the outcome, not the update's arrays: a backlog of
        # attacks then costs the server no memory (their inputs wait on disk).
        ids = np.asarray(update.audit.get("sample-ids", []), dtype=np.int64)
        self._executor.submit(
            job,
            on_outcome=lambda out: self._judge(out, base, ids),
            on_error=lambda err: self._write(
                {**base, "status": "error", "reason": f"{type(err).__name__}: {err}"}
            ),
        )

    def finish(self) -> None:
        """Wait (up to ``wait_s`` in all) for queued attacks; record the rest as timed out."""
        self._executor.wait(self.spec.wait_s)
        self._executor.close()  # no outcome comes back after this
        with self._lock:
            pending = list(self._pending.values())
        for base in pending:
            self._write(
                {
                    **base,
                    "status": "timeout",
                    "reason": f"not finished {self.spec.wait_s:.0f} s after the last round",
                }
            )
        shutil.rmtree(self.run_dir / JOBS_DIR, ignore_errors=True)

    # -- internals -------------------------------------------------------------------------

    def _targeted(self, server_round: int, client: int) -> bool:
        return (not self.spec.rounds or server_round in self.spec.rounds) and (
            not self.spec.clients or client in self.spec.clients
        )

    @staticmethod
    def _base(update: InterceptedUpdate) -> dict[str, Any]:
        declared = update.declared
        epsilon = declared.get("epsilon")
        return {
            **dict.fromkeys(METRIC_KEYS),
            "round": update.server_round,
            "client": int(declared.get("partition-id", update.node_id)),
            "node_id": update.node_id,
            "defence": declared.get("defence", "unknown"),
            "epsilon": float(epsilon) if epsilon is not None else None,
            "declared": {k: v for k, v in declared.items() if k != "train-loss"},
            "batch_size": len(update.audit.get("sample-ids", [])),
        }

    def _job(
        self, update: InterceptedUpdate, base: Mapping[str, Any]
    ) -> tuple[AttackJob, dict[str, str]]:
        """The attack's inputs: the update as a gradient, plus what the attacker may know."""
        declared = update.declared
        assert update.weight is not None and update.bias is not None
        lr = float(declared.get("lr", 1.0))
        knowledge = {"lr": "declared" if "lr" in declared else "assumed 1"}
        batch_size = None
        if self.spec.knows_batch_size and "batch-size" in declared:
            batch_size = int(declared["batch-size"])
            knowledge["batch_size"] = "declared"
        else:
            knowledge["batch_size"] = "estimated"
        # The weights arrive rounded to their dtype (float32): the difference of two rounded
        # weights carries that round-off, amplified by 1 / lr, as noise the server can compute.
        rounding = rounding_noise(update.weight, lr) * math.sqrt(int(declared.get("steps", 1)))
        noise_std = rounding
        knowledge["noise"] = "rounding" if rounding else "none"
        if self.spec.knows_noise and "noise-std" in declared:
            # Each step adds its own noise: the summed update carries sqrt(steps) times as much.
            dp = float(declared["noise-std"]) * math.sqrt(int(declared.get("steps", 1)))
            noise_std = math.hypot(dp, rounding)
            knowledge["noise"] = "declared" + (" + rounding" if rounding else "")
        elif base["defence"] == "dp":
            knowledge["noise"] = "unknown" + (" + rounding" if rounding else "")
        arrays = write_arrays(
            self.run_dir / JOBS_DIR / _name(base, ".npz"),
            grad_weight=update_as_gradient(
                update.sent_weight.astype(np.float64), update.weight.astype(np.float64), lr
            ),
            grad_bias=update_as_gradient(
                update.sent_bias.astype(np.float64), update.bias.astype(np.float64), lr
            ),
            weight=update.sent_weight.astype(np.float64),
            bias=update.sent_bias.astype(np.float64),
        )
        job = AttackJob(
            server_round=base["round"],
            client=base["client"],
            arrays=arrays,
            batch_size=batch_size,
            noise_std=noise_std or None,
            config=attack_config(
                self.spec, self.seed * 7919 + base["round"] * 101 + base["client"]
            ),
        )
        return job, knowledge

    def _judge(self, out: AttackOutcome, base: dict[str, Any], ids: np.ndarray) -> None:
        """Score a finished attack against the samples the client trained on; file it."""
        record = {**base, "seconds": out.seconds}
        if out.error is not None or out.inputs is None:
            self._write({**record, "status": "refused", "reason": out.error})
            return
        truth = torch.from_numpy(self.data.images[ids]).permute(0, 3, 1, 2).double() / 255
        rec = self.data.normalization.undo(torch.from_numpy(out.inputs).reshape(-1, 3, 32, 32))
        quality = match_and_score(rec, truth)
        summary = out.summary
        record |= {
            "status": summary["status"],
            "reason": summary["reason"],
            "batch_size_estimated": summary["batch_size"],
            "batch_size_method": summary["batch_size_method"],
            **{k: v for k, v in quality.summary().items() if k != "samples"},
            "confidence_mean": summary["confidence_mean"],
            "timings": summary["timings"],
            "counts": summary["counts"],
        }
        if self.spec.grids and len(ids):
            matched = np.zeros_like(truth.numpy())
            ok = quality.match >= 0
            matched[ok] = rec.numpy()[quality.match[ok]]
            name = _name(base, ".png")
            save_grid(truth.numpy(), matched, self.run_dir / GRID_DIR / name)
            record["grid"] = f"{GRID_DIR}/{name}"
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            append_jsonl(self.run_dir / AUDIT_FILE, record)
            self._pending.pop((record["round"], record["client"]), None)
            (self.run_dir / JOBS_DIR / _name(record, ".npz")).unlink(missing_ok=True)
