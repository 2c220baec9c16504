"""The judge at work during a run: every intercepted update becomes attack jobs beside the
federation (one per attack the audit runs on it), and every finished job one line of
``audit.jsonl``, written as soon as it is known. With ``proxies`` on, each attacked batch's
vulnerability proxies go to ``proxies.jsonl``, and at the end the per-round correlation of each
proxy with the optimisation attack's error to ``forecast.jsonl``.

Ground truth (which samples a client trained on) enters only here, after the attack returned,
and in the judge's own proxy jobs.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import math
import shutil
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attacks import ATTACKS, ServerView
from clients.defences import Disclosure, declared_defences, defence_label
from clients.defences.base import BATCH_SIZE, EPSILON, LR, STEPS, combined_noise
from fl_sim.apps.recorder import append_jsonl
from fl_sim.audit.executors import WorkerJob, make_executor
from fl_sim.audit.grid import save_grid
from fl_sim.audit.heatmap import save_heatmap
from fl_sim.audit.job import AttackJob, AttackOutcome, write_arrays
from fl_sim.audit.metrics import match_and_score
from fl_sim.audit.plans import PLANS, AttackRun, audit_runs, covers
from fl_sim.audit.proxy_job import ProxyJob, ProxyOutcome, write_proxy_arrays
from fl_sim.audit.updates import save_update
from fl_sim.config.cluster import ClusterSpec
from fl_sim.config.schema import AuditSpec
from fl_sim.data.federated import FederatedData
from fl_sim.forecast.table import joined_samples, round_correlations
from fl_sim.model import array_keys, next_linear
from fl_sim.report.build import read_jsonl
from strategies import InterceptedUpdate, LeftOut, update_as_gradient
from strategies.reply import (
    PARTITION_ID,
    REASON,
    SAMPLE_IDS,
    STATUS,
    TAMPER_FLAGGED,
    TRAIN_LOSS,
)

log = logging.getLogger(__name__)

AUDIT_FILE = "audit.jsonl"
PROXIES_FILE = "proxies.jsonl"
FORECAST_FILE = "forecast.jsonl"
FORECAST_SAMPLES_FILE = "forecast_samples.jsonl"
UPDATES_DIR = "updates"
# Job inputs on their way to the attack workers; removed once judged.
JOBS_DIR = "jobs"
# Every record carries these (None where no reconstruction was scored).
METRIC_KEYS = (
    "batch_size_estimated", "psnr_mean", "psnr_min", "share_exact", "share_near_exact",
    "ssim_mean", "seconds",
)  # fmt: skip
GRID_DIR = "grids"
PROXY_RUN = "proxies"
# The status of the attacks still running when the run was interrupted.
INTERRUPTED = "interrupted"


def _name(base: Mapping[str, Any], suffix: str) -> str:
    return f"r{base['round']:03d}-c{base['client']:03d}{suffix}"


def disclosures(declared: Mapping[str, Any], weight_update: np.ndarray | None) -> list[Disclosure]:
    """What each defence the reply declares lets the server tell the attack (its knowledge
    rule, :meth:`clients.defences.Defence.disclose`)."""
    return [d.disclose(declared, weight_update) for d in declared_defences(declared)]


def next_layer_helps(declared: Mapping[str, Any]) -> bool:
    """Whether a defence of the reply makes it one noisy step: its next layer's gradient is
    then one noisy batch gradient, and SPEAR++ fixes the samples' scales from it far better
    than from the first layer's bias gradient alone (worth keeping the reply whole for)."""
    return any(d.next_layer for d in disclosures(declared, None))


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
        What to attack, with which attacks, knowledge and budget.
    data
        The run's data: only for judging (ground truth), never for attacking (bar the labels
        when ``knows_labels`` grants them, and the input range the server's pipeline fixes).
    run_dir
        Where ``audit.jsonl``, ``proxies.jsonl`` and ``grids/`` grow.
    seed
        Seeds the attacks.
    architecture
        The model the server built (its structure; weights are not used): whole-model attacks
        and the proxies need it, and SPEAR++ takes the next layer's gradient from one-step DP
        updates when it knows which layer that is.
    layer
        ArrayRecord keys of the first linear layer's weight and bias.
    done
        (round, client, run) already on file: not attacked again (``run`` is a record's
        attack label, or ``proxies``).
    cluster
        Where the jobs run: its ``attack_executor`` with ``spec.workers`` jobs at once
        (default: a local pool of that many processes).
    behaviour
        The server behaviour that chose what was sent (``honest``, ``sparsify``, ...): every
        record says it.
    """

    def __init__(
        self,
        spec: AuditSpec,
        data: FederatedData,
        run_dir: Path,
        seed: int,
        architecture: nn.Module | None = None,
        layer: tuple[str, str] = ("weight", "bias"),
        done: Collection[tuple[int, int, str]] = (),
        cluster: ClusterSpec | None = None,
        behaviour: str = "honest",
    ) -> None:
        self.spec = spec
        self.behaviour = behaviour
        self.data = data
        self.run_dir = run_dir
        self.seed = seed
        self.layer = layer
        self.done = frozenset(done)
        self.runs = audit_runs(spec)
        needs_model = spec.proxies or any(ATTACKS[r.attack].whole_model for r in self.runs)
        if needs_model and architecture is None:
            raise ValueError("the audit's attacks or proxies need the model's architecture")
        # Only the structure travels to the workers: a weightless copy on the meta device.
        self.architecture = copy.deepcopy(architecture).to("meta") if architecture else None
        found = next_linear(architecture) if architecture is not None else None
        self.next_layer = array_keys(found[0]) if found else None
        cluster = cluster or ClusterSpec()
        self._executor = make_executor(cluster.attack_executor, spec.workers, cluster)
        self._lock = threading.Lock()
        # Records still to come, by (round, client, run).
        self._pending: dict[tuple[int, int, str], dict[str, Any]] = {}

    def __call__(self, update: InterceptedUpdate) -> None:
        """File an update: rejected at once if unusable, else queued for attack."""
        self.queue(update)

    def left_out(self, fault: LeftOut) -> None:
        """File a reply the server left out of aggregation: one record, never attacked, with
        the fault's status (``diverged``, ``client-error``, ``rejected``) and reason."""
        client = fault.client if fault.client is not None else fault.node_id
        base = self._base_of(fault.server_round, fault.node_id, client, fault.declared, fault.audit)
        self._write({**base, "attack": None, "status": fault.status, "reason": fault.reason})

    def runs_for(self, server_round: int, client: int) -> list[AttackRun]:
        """The attacks the audit runs on this client's update of this round."""
        return [r for r in self.runs if covers(self.spec, r, server_round, client)]

    def keeps_whole(self, server_round: int, declared: Mapping[str, Any]) -> bool:
        """Whether this reply is needed whole: a whole-model attack or the proxies target it,
        or a first-layer attack that uses the next layer of a one-step DP update."""
        client = int(declared.get("partition-id", -1))
        runs = self.runs_for(server_round, client)
        return bool(runs) and (
            self.spec.proxies
            or any(ATTACKS[r.attack].whole_model for r in runs)
            or (self.next_layer is not None and next_layer_helps(declared))
        )

    def queue(self, update: InterceptedUpdate) -> int:
        """Queue the attack (and proxy) jobs of an update; returns how many were queued."""
        base = self._base(update)
        if self.spec.keep_updates and update.problem is None:
            save_update(update, self.run_dir / UPDATES_DIR / _name(base, ".npz"))
        if update.problem is not None:
            self._write(
                {**base, "attack": None, "status": update.failure, "reason": update.problem}
            )
            return 0
        runs = self.runs_for(base["round"], base["client"])
        ids = self._ids(update)  # the judge keeps these, not the update's arrays
        queued = 0
        for run in runs:
            if (base["round"], base["client"], run.label) in self.done:
                continue
            record = {**base, "attack": run.attack, **({"loss": run.loss} if run.loss else {})}
            if ATTACKS[run.attack].whole_model and update.arrays is None:
                self._write(
                    {**record, "status": "refused", "reason": "the update was not kept whole"},
                    run.label,
                )
                continue
            job, knowledge = self._job(update, base, run)
            record["knowledge"] = knowledge
            self._submit(
                run.label,
                record,
                job,
                functools.partial(self._judge, base=record, ids=ids, run=run.label),
            )
            queued += 1
        key = (base["round"], base["client"], PROXY_RUN)
        if self.spec.proxies and runs and key not in self.done:
            if update.sent_arrays is None:
                self._write_proxies({**base, "status": "refused", "reason": "not kept whole"})
            else:
                row = {k: base[k] for k in ("round", "client", "node_id", "defence")}
                self._submit(
                    PROXY_RUN,
                    row,
                    self._proxy_job(update, base),
                    functools.partial(self._proxies_done, row=row),
                )
                queued += 1
        return queued

    def finish(self, interrupted: bool = False) -> None:
        """Wait (up to ``wait_s`` in all) for queued jobs; record the rest as timed out; then
        write the per-round correlations of the proxies (``forecast.jsonl``).

        With ``interrupted`` (the run was stopped) nothing is waited for: the jobs still
        running are stopped and recorded as ``interrupted``.
        """
        if not interrupted:
            self._executor.wait(self.spec.wait_s)
        self._executor.close()  # no outcome comes back after this
        with self._lock:
            pending = list(self._pending.items())
        for (_, _, run), record in pending:
            late = {
                **record,
                STATUS: INTERRUPTED if interrupted else "timeout",
                REASON: "the run was interrupted before this job finished"
                if interrupted
                else f"not finished {self.spec.wait_s:.0f} s after the last round",
            }
            if run == PROXY_RUN:
                self._write_proxies(late)
            else:
                self._write(late, run)
        shutil.rmtree(self.run_dir / JOBS_DIR, ignore_errors=True)
        if self.spec.proxies:
            write_forecast(self.run_dir)

    # -- internals -------------------------------------------------------------------------

    def _submit(
        self, run: str, record: dict[str, Any], job: WorkerJob, callback: Callable[[Any], None]
    ) -> None:
        def failed(err: BaseException) -> None:
            failure = {**record, "status": "error", "reason": f"{type(err).__name__}: {err}"}
            if run == PROXY_RUN:
                self._write_proxies(failure)
            else:
                self._write(failure, run)

        with self._lock:  # before submitting: the outcome may come back at once
            self._pending[(record["round"], record["client"], run)] = record
        self._executor.submit(job, on_outcome=callback, on_error=failed)

    @classmethod
    def _base(cls, update: InterceptedUpdate) -> dict[str, Any]:
        declared = update.declared
        client = int(declared.get(PARTITION_ID, update.node_id))
        return cls._base_of(update.server_round, update.node_id, client, declared, update.audit)

    @staticmethod
    def _base_of(
        server_round: int,
        node_id: int,
        client: int,
        declared: Mapping[str, Any],
        audit: Mapping[str, Any],
    ) -> dict[str, Any]:
        """What every record of this client's reply says, whatever became of it."""
        epsilon = declared.get(EPSILON)
        return {
            **dict.fromkeys(METRIC_KEYS),
            "round": server_round,
            "client": client,
            "node_id": node_id,
            "defence": defence_label(declared),
            "epsilon": float(epsilon) if epsilon is not None else None,
            "declared": {k: v for k, v in declared.items() if k != TRAIN_LOSS},
            "batch_size": len(audit.get(SAMPLE_IDS, [])),
            # The client's own check of the model it was sent (None: it did not say).
            "tamper_flagged": declared.get(TAMPER_FLAGGED),
        }

    def _ids(self, update: InterceptedUpdate) -> np.ndarray:
        return np.asarray(update.audit.get(SAMPLE_IDS, []), dtype=np.int64)

    def _job(
        self, update: InterceptedUpdate, base: Mapping[str, Any], run: AttackRun
    ) -> tuple[AttackJob, dict[str, str]]:
        """The attack's inputs: the update as a gradient, plus what the attacker may know."""
        declared = update.declared
        received_weight, _ = update.received_layer()
        lr = float(declared.get(LR, 1.0))
        steps = int(declared.get(STEPS, 1))
        knowledge = {"lr": "declared" if LR in declared else "assumed 1"}
        batch_size = None
        if self.spec.knows_batch_size and BATCH_SIZE in declared:
            batch_size = int(declared[BATCH_SIZE])
            knowledge["batch_size"] = "declared"
        else:
            knowledge["batch_size"] = "estimated"
        # The weights arrive rounded to their dtype (float32): the difference of two rounded
        # weights carries that round-off, amplified by 1 / lr, as noise the server can compute.
        rounding = rounding_noise(received_weight, lr) * math.sqrt(steps)
        noise_std = rounding
        knowledge["noise"] = "rounding" if rounding else "none"
        noisy = [
            d
            for d in disclosures(declared, received_weight.astype(np.float64) - update.sent_weight)
            if d.adds_noise
        ]
        suffix = " + rounding" if rounding else ""
        if not self.spec.knows_noise:
            # Told nothing: the attack fits the noise (DP and round-off alike) to the spectrum.
            noise_std = 0.0
            knowledge["noise"] = "not told: estimated from the gradient's spectrum"
        elif any(d.noise_std is None for d in noisy):
            knowledge["noise"] = "unknown" + suffix
        elif noisy:
            noise_std = combined_noise(noisy, rounding)
            knowledge["noise"] = "declared" + suffix
        seed = self.seed * 7919 + base["round"] * 101 + base["client"]
        path = self.run_dir / JOBS_DIR / _name(base, f"-{run.label}.npz")
        if ATTACKS[run.attack].whole_model:
            arrays, view = self._whole_view(update, path, lr, steps, noise_std, knowledge)
        else:
            arrays, view = self._layer_view(update, path, lr, noise_std, knowledge)
        view = dataclasses.replace(view, batch_size=batch_size)
        config = PLANS[run.attack].settings(self.spec, run, seed)
        job = AttackJob(base["round"], base["client"], run.label, run.attack, arrays, view, config)
        return job, knowledge

    def _layer_view(
        self,
        update: InterceptedUpdate,
        path: Path,
        lr: float,
        noise_std: float,
        knowledge: dict[str, str],
    ) -> tuple[str, ServerView]:
        """The first layer's arrays (written to ``path``) and the view of a first-layer attack;
        for a one-step DP update kept whole, the next layer's gradient too."""
        w_key, b_key = self.layer
        weight, bias = update.received_layer()
        sent = {w_key: update.sent_weight, b_key: update.sent_bias}
        received = {w_key: weight, b_key: bias}
        nxt = self.next_layer
        if not (update.arrays is not None and next_layer_helps(update.declared)):
            nxt = None
        if nxt is not None:
            sent_all, received_all = update.whole()
            sent |= {k: sent_all[k] for k in nxt}
            received |= {k: received_all[k] for k in nxt}
            knowledge["next_layer"] = "one DP step: its gradient fixes the samples' scales"
        gradient = {
            k: update_as_gradient(sent[k].astype(np.float64), received[k].astype(np.float64), lr)
            for k in sent
        }
        weights = {k: sent[k].astype(np.float64) for k in self.layer}
        arrays = write_arrays(path, weights=weights, gradient=gradient)
        view = ServerView({}, {}, self.layer, next_layer=nxt, noise_std=noise_std or None)
        return arrays, view

    def _whole_view(
        self,
        update: InterceptedUpdate,
        path: Path,
        lr: float,
        steps: int,
        noise_std: float,
        knowledge: dict[str, str],
    ) -> tuple[str, ServerView]:
        """Every array (written to ``path``) and the view of a whole-model attack."""
        sent_all, received_all = update.whole()
        # The standard threat model for multi-step updates: match the pseudo-gradient, here
        # the mean step, (sent - received) / (lr * steps), the scale of one batch gradient.
        sent = {k: v.astype(np.float64) for k, v in sent_all.items()}
        gradient = {
            k: update_as_gradient(sent[k], received_all[k].astype(np.float64), lr) / steps
            for k in sent
        }
        knowledge["gradient"] = f"update / (lr x {steps} steps)"
        labels = None
        if self.spec.knows_labels:
            labels = tuple(int(v) for v in self.data.labels[self._ids(update)])
        knowledge["labels"] = "told" if labels is not None else "recovered"
        described = self.data.description
        norm = described.normalization
        bounds = None
        # The attack registry shapes bounds per image channel (C x 1 x 1): a record's features
        # would not broadcast, so tabular records go unbounded.
        if described.is_image:
            bounds = (
                tuple((0 - m) / s for m, s in zip(norm.mean, norm.std, strict=True)),
                tuple((1 - m) / s for m, s in zip(norm.mean, norm.std, strict=True)),
            )
            knowledge["bounds"] = "pixel range through the normalisation"
        else:
            knowledge["bounds"] = "none (per-channel bounds are for images)"
        view = ServerView(
            {},
            {},
            self.layer,
            architecture=self.architecture,
            input_shape=described.input_shape,
            noise_std=(noise_std / steps) or None,
            labels=labels,
            bounds=bounds,
        )
        return write_arrays(path, sent, gradient), view

    def _proxy_job(self, update: InterceptedUpdate, base: Mapping[str, Any]) -> ProxyJob:
        sent_all, _ = update.whole()
        if self.architecture is None:  # the constructor refuses proxies without one
            raise ValueError("the proxies need the model's architecture")
        ids = self._ids(update)
        inputs, labels = self.data.tensors(ids)
        path = write_proxy_arrays(
            self.run_dir / JOBS_DIR / _name(base, f"-{PROXY_RUN}.npz"),
            dict(sent_all),
            inputs.double().numpy(),
            labels.numpy(),
            ids,
        )
        return ProxyJob(
            base["round"],
            base["client"],
            path,
            self.architecture,
            self.spec.proxy_tol,
            self.spec.proxy_max_iter,
            self.seed * 7919 + base["round"] * 101 + base["client"],
        )

    def _judge(self, out: AttackOutcome, base: dict[str, Any], ids: np.ndarray, run: str) -> None:
        """Score a finished attack against the samples the client trained on; file it."""
        record = {**base, "seconds": out.seconds}
        if out.error is not None or out.inputs is None:
            self._write({**record, "status": "refused", "reason": out.error}, run)
            return
        described = self.data.description
        truth = self.data.unit(ids)
        rec = described.normalization.undo(
            torch.from_numpy(out.inputs).reshape(-1, *described.input_shape)
        )
        quality = match_and_score(rec, truth)
        summary = out.summary
        record |= {
            "status": summary["status"],
            "reason": summary["reason"],
            "batch_size_estimated": summary["batch_size"],
            "batch_size_method": summary["batch_size_method"],
            # What the attack inferred of the batch size and the noise from the spectrum.
            "batch_size_confidence": summary.get("batch_size_confidence"),
            "noise_std_estimated": summary.get("noise_std_estimated"),
            "noise_std_used": summary.get("noise_std_used"),
            "undeclared_noise": summary.get("undeclared_noise"),
            "noise_note": summary.get("noise_note"),
            **{k: v for k, v in quality.summary().items() if k != "samples"},
            # What the attack vouches for without ground truth: columns (each one sample's
            # output gradient) and samples (inputs), beside what the judge found.
            "columns_verified": summary["verified"],
            "certified": summary["certified"],
            "share_certified": summary["certified"] / max(len(ids), 1),
            "confidence_mean": summary["confidence_mean"],
            "timings": summary["timings"],
            "counts": summary["counts"],
            "samples": [
                {"id": int(i), "label": int(self.data.labels[i]), "psnr": float(p), "mse": float(m)}
                for i, p, m in zip(ids, quality.psnr, quality.mse, strict=True)
            ],
        }
        if "label_values" in summary["settings"]:
            record["labels_recovered"] = summary["settings"]["label_values"]
        if self.spec.grids and len(ids):
            matched = np.zeros_like(truth.numpy())
            ok = quality.match >= 0
            matched[ok] = rec.numpy()[quality.match[ok]]
            # SPEAR++'s grids keep the names they had before there were other attacks.
            name = _name(base, ".png" if run == "spearpp" else f"-{run}.png")
            # Images side by side; tabular records as a heat-map of the B x n matrix.
            save = save_grid if described.is_image else save_heatmap
            save(truth.numpy(), matched, self.run_dir / GRID_DIR / name)
            record["grid"] = f"{GRID_DIR}/{name}"
        self._write(record, run)

    def _proxies_done(self, out: ProxyOutcome, row: dict[str, Any]) -> None:
        self._write_proxies(
            {**row, "status": "done", "seconds": out.seconds, "samples": out.samples}
        )

    def _write(self, record: dict[str, Any], run: str | None = None) -> None:
        with self._lock:
            append_jsonl(self.run_dir / AUDIT_FILE, {**record, "server_behaviour": self.behaviour})
            if run is not None:
                self._forget(record, run)

    def _write_proxies(self, row: dict[str, Any]) -> None:
        with self._lock:
            append_jsonl(self.run_dir / PROXIES_FILE, row)
            self._forget(row, PROXY_RUN)

    def _forget(self, record: Mapping[str, Any], run: str) -> None:
        self._pending.pop((record["round"], record["client"], run), None)
        (self.run_dir / JOBS_DIR / _name(record, f"-{run}.npz")).unlink(missing_ok=True)


def write_forecast(run_dir: Path) -> Path:
    """``forecast_samples.jsonl``: per sample, its proxies beside the MSE and PSNR of every
    attack run that scored it; ``forecast.jsonl``: per round and optimisation-attack run (then
    over all rounds), the Spearman correlation of each proxy with the attack's MSE. Both are
    rewritten from ``audit.jsonl`` and ``proxies.jsonl`` each time (derived, not records)."""
    samples = joined_samples(read_jsonl(run_dir / AUDIT_FILE), read_jsonl(run_dir / PROXIES_FILE))
    (run_dir / FORECAST_SAMPLES_FILE).write_text("".join(json.dumps(s) + "\n" for s in samples))
    path = run_dir / FORECAST_FILE
    path.write_text("".join(json.dumps(row) + "\n" for row in round_correlations(samples)))
    return path
