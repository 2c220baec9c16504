"""The judge at work during a run: every intercepted update becomes attack jobs beside the
federation (one per attack the audit runs on it), and every finished job one line of
``audit.jsonl``, written as soon as it is known. With ``proxies`` on, each attacked batch's
vulnerability proxies go to ``proxies.jsonl``, and at the end the per-round correlation of each
proxy with the optimisation attack's error to ``forecast.jsonl``.

Under SecAgg+ the server holds only each round's sum (:meth:`Auditor.queue_aggregate`): it is
attacked as one batch of every summed client's samples, and the judge files the cohort's
record and one per client with what of its own samples came back.

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
from fl_sim.audit.grid import save_grid, save_row
from fl_sim.audit.heatmap import save_heatmap
from fl_sim.audit.job import AttackJob, AttackOutcome, write_arrays
from fl_sim.audit.metrics import BatchQuality, match_and_score
from fl_sim.audit.plans import PLANS, AttackRun, audit_runs, covers
from fl_sim.audit.proxy_job import ProxyJob, ProxyOutcome, write_proxy_arrays
from fl_sim.audit.updates import save_update
from fl_sim.config.cluster import ClusterSpec
from fl_sim.config.federation import SecAggSpec
from fl_sim.config.schema import AuditSpec
from fl_sim.data.federated import FederatedData
from fl_sim.data.normalize import Normalization
from fl_sim.forecast.table import joined_samples, round_correlations
from fl_sim.model import array_keys, next_linear
from fl_sim.report.build import COHORT_VIEW, read_jsonl
from strategies import InterceptedAggregate, InterceptedUpdate, LeftOut, update_as_gradient
from strategies.quantisation import secagg_noise_std
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
# Without ground truth: each reconstruction (inputs, certified mask), for the user to read.
RECONSTRUCTIONS_DIR = "reconstructions"
PROXY_RUN = "proxies"
# The status of the attacks still running when the run was interrupted.
INTERRUPTED = "interrupted"
# Under secure aggregation: the record of the attack on a round's sum (its ``client``), and
# the ``view`` of that record and of the per-client records drawn from it.
COHORT = -1
AGGREGATE_VIEW = "aggregate"


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
        ``None`` for a federation whose data the server does not hold (a user's own Flower
        app): SPEAR++ alone runs, and each record carries what the attack itself knows (status,
        estimated batch size, certified samples, timings, the reconstruction under
        ``reconstructions/`` and its grid), the judge's metrics ``None``.
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
    round_epsilon
        Round -> the federation's epsilon after it (central DP): the records' ``epsilon`` where
        a client declares none of its own.
    draws
        (client, round) -> the ids of the samples the client trained on: ground truth for
        judging secure aggregates, whose clients send none (the simulation's own draw).
    input_shape, normalization
        Without ``data``: one input's shape (C x H x W images get grids) and the normalisation
        to undo in them (none: each image stretched to [0, 1]).
    behaviour
        The server behaviour that chose what was sent (``honest``, ``sparsify``, ...): every
        record says it.
    """

    def __init__(
        self,
        spec: AuditSpec,
        data: FederatedData | None,
        run_dir: Path,
        seed: int,
        architecture: nn.Module | None = None,
        layer: tuple[str, str] = ("weight", "bias"),
        done: Collection[tuple[int, int, str]] = (),
        cluster: ClusterSpec | None = None,
        round_epsilon: Callable[[int], float] | None = None,
        draws: Callable[[int, int], np.ndarray] | None = None,
        input_shape: tuple[int, ...] | None = None,
        normalization: Normalization | None = None,
        behaviour: str = "honest",
    ) -> None:
        if data is None and (spec.proxies or spec.attacks != ("spearpp",)):
            raise ValueError(
                f"without ground truth only SPEAR++ can run: audit.attacks={list(spec.attacks)}"
                f" and audit.proxies={spec.proxies} need the run's data"
            )
        self.spec = spec
        self.round_epsilon = round_epsilon
        self.draws = draws
        self.behaviour = behaviour
        self.data = data
        self.input_shape = input_shape
        self.normalization = normalization
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

    def _base(self, update: InterceptedUpdate) -> dict[str, Any]:
        declared = update.declared
        client = int(declared.get(PARTITION_ID, update.node_id))
        return self._base_of(update.server_round, update.node_id, client, declared, update.audit)

    def _base_of(
        self,
        server_round: int,
        node_id: int,
        client: int,
        declared: Mapping[str, Any],
        audit: Mapping[str, Any],
    ) -> dict[str, Any]:
        """What every record of this client's reply says, whatever became of it."""
        epsilon = declared.get(EPSILON)
        if epsilon is None and self.round_epsilon is not None:
            epsilon = self.round_epsilon(server_round)
        return {
            **dict.fromkeys(METRIC_KEYS),
            "round": server_round,
            "client": client,
            "node_id": node_id,
            "defence": defence_label(declared),
            "epsilon": float(epsilon) if epsilon is not None else None,
            "declared": {k: v for k, v in declared.items() if k != TRAIN_LOSS},
            # The true batch size is ground truth: unknown (None) where the client sent none.
            "batch_size": len(audit[SAMPLE_IDS]) if SAMPLE_IDS in audit else None,
            # The client's own check of the model it was sent (None: it did not say).
            "tamper_flagged": declared.get(TAMPER_FLAGGED),
        }

    def _truth(self) -> FederatedData:
        """The run's data, for the paths that the constructor opens only with it."""
        if self.data is None:
            raise ValueError("this part of the audit needs the run's data (ground truth)")
        return self.data

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
            labels = tuple(int(v) for v in self._truth().labels[self._ids(update)])
        knowledge["labels"] = "told" if labels is not None else "recovered"
        described = self._truth().description
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
        inputs, labels = self._truth().tensors(ids)
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
        if self.data is None:
            self._file_unjudged(out, record, run)
            return
        rec, truth, quality = self._score(out, ids)
        record |= self._attack_fields(out) | self._quality_fields(quality, ids)
        record["share_certified"] = out.summary["certified"] / max(len(ids), 1)
        if "label_values" in out.summary["settings"]:
            record["labels_recovered"] = out.summary["settings"]["label_values"]
        self._grid(record, run, truth, rec, quality)
        self._write(record, run)

    def _score(
        self, out: AttackOutcome, ids: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, BatchQuality]:
        """The reconstruction and the truth on the data's [0, 1] scale, matched and scored."""
        data = self._truth()
        described = data.description
        truth = data.unit(ids)
        if out.inputs is None:
            raise ValueError("the attack returned no reconstruction")
        rec = described.normalization.undo(
            torch.from_numpy(out.inputs).reshape(-1, *described.input_shape)
        )
        return rec, truth, match_and_score(rec, truth)

    @staticmethod
    def _attack_fields(out: AttackOutcome) -> dict[str, Any]:
        """What the attack said of its reconstruction, without ground truth."""
        summary = out.summary
        return {
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
            # What the attack vouches for without ground truth: columns (each one sample's
            # output gradient) and samples (inputs), beside what the judge found.
            "columns_verified": summary["verified"],
            "certified": summary["certified"],
            "confidence_mean": summary["confidence_mean"],
            "timings": summary["timings"],
            "counts": summary["counts"],
        }

    def _quality_fields(self, quality: BatchQuality, ids: np.ndarray) -> dict[str, Any]:
        """The judge's figures over the true samples ``ids``, and each sample's."""
        labels = self._truth().labels
        return {
            **{k: v for k, v in quality.summary().items() if k != "samples"},
            "samples": [
                {"id": int(i), "label": int(labels[i]), "psnr": float(p), "mse": float(m)}
                for i, p, m in zip(ids, quality.psnr, quality.mse, strict=True)
            ],
        }

    def _grid(
        self,
        record: dict[str, Any],
        run: str,
        truth: torch.Tensor,
        rec: torch.Tensor,
        quality: BatchQuality,
    ) -> None:
        """Save the originals over their matched reconstructions; name it in ``record``."""
        if not self.spec.grids or not len(truth):
            return
        matched = np.zeros_like(truth.numpy())
        ok = quality.match >= 0
        matched[ok] = rec.numpy()[quality.match[ok]]
        # SPEAR++'s grids keep the names they had before there were other attacks.
        name = _name(record, ".png" if run == "spearpp" else f"-{run}.png")
        # Images side by side; tabular records as a heat-map of the B x n matrix.
        save = save_grid if self._truth().description.is_image else save_heatmap
        save(truth.numpy(), matched, self.run_dir / GRID_DIR / name)
        record["grid"] = f"{GRID_DIR}/{name}"

    # -- secure aggregation ------------------------------------------------------------------

    def queue_aggregate(self, aggregate: InterceptedAggregate, secagg: SecAggSpec) -> int:
        """Queue the first-layer attacks on a SecAgg+ round's sum, as one batch of every summed
        client's samples; returns how many were queued.

        The attack is told what the server can work out: the quantisation noise of Flower's
        settings and the summed clients' weights (with ``knows_noise``), the total of their
        declared batch sizes (with ``knows_batch_size``). Whole-model attacks are not run on a
        sum of updates.
        """
        server_round = aggregate.server_round
        members = []
        for node, declared in zip(aggregate.node_ids, aggregate.declared, strict=True):
            client = int(declared.get(PARTITION_ID, node))
            ids = self.draws(client, server_round) if self.draws is not None else np.empty(0)
            audit = {SAMPLE_IDS: [int(i) for i in ids]}
            base = self._base_of(server_round, node, client, declared, audit)
            members.append(({**base, "view": AGGREGATE_VIEW}, np.asarray(ids, dtype=np.int64)))
        clients = [m["client"] for m, _ in members]
        cohort = {
            **dict.fromkeys(METRIC_KEYS),
            "round": server_round,
            "client": COHORT,
            "node_id": None,
            "defence": "secagg",
            "epsilon": None,
            "view": COHORT_VIEW,
            "clients": clients,
            "dropped_nodes": list(aggregate.dropped),
            "batch_size": int(sum(len(ids) for _, ids in members)),
        }
        runs = [
            r
            for r in self.runs
            if not ATTACKS[r.attack].whole_model
            and any(covers(self.spec, r, server_round, c) for c in clients)
        ]
        queued = 0
        for run in runs:
            if (server_round, COHORT, run.label) in self.done:
                continue
            job, knowledge = self._aggregate_job(aggregate, secagg, cohort, run)
            record = {**cohort, "attack": run.attack, "knowledge": knowledge}
            self._submit(
                run.label,
                record,
                job,
                functools.partial(self._judge_cohort, base=record, members=members, run=run.label),
            )
            queued += 1
        return queued

    def _aggregate_job(
        self,
        aggregate: InterceptedAggregate,
        secagg: SecAggSpec,
        cohort: Mapping[str, Any],
        run: AttackRun,
    ) -> tuple[AttackJob, dict[str, str]]:
        """The attack's inputs for a sum: the averaged update as one gradient."""
        lrs = [float(d.get("lr", 1.0)) for d in aggregate.declared]
        # One step of every client at one lr makes the average step lr times the gradient of
        # the union batch; with several lrs the columns are rescaled, which SPEAR++ ignores.
        lr = sum(lrs) / len(lrs)
        knowledge = {"lr": "declared" if len(set(lrs)) == 1 else "mean of the declared lrs"}
        knowledge["view"] = (
            f"the SecAgg+ sum of {len(lrs)} clients: one batch of their samples together"
        )
        batch_size = None
        declared_sizes = [d.get("batch-size") for d in aggregate.declared]
        if self.spec.knows_batch_size and all(isinstance(b, int) for b in declared_sizes):
            batch_size = int(sum(declared_sizes))  # type: ignore[arg-type]
            knowledge["batch_size"] = "sum of the declared"
        else:
            knowledge["batch_size"] = "estimated"
        noise_std = 0.0
        if self.spec.knows_noise:
            weights = aggregate.num_examples
            quantisation = secagg_noise_std(
                weights, secagg.clipping_range, secagg.quantization_range, secagg.max_weight
            )
            # Each DP client's own noise, weighted into the average as its update is.
            dp = math.sqrt(
                sum(
                    (n * float(d.get("noise-std", 0.0))) ** 2 * int(d.get("steps", 1))
                    for n, d in zip(weights, aggregate.declared, strict=True)
                )
            ) / sum(weights)
            noise_std = math.hypot(quantisation, dp) / lr
            knowledge["noise"] = "SecAgg+ quantisation" + (" + declared DP" if dp else "")
        else:
            knowledge["noise"] = "not told: estimated from the gradient's spectrum"
        w_key, b_key = self.layer
        sent = {w_key: aggregate.sent_weight, b_key: aggregate.sent_bias}
        summed = {w_key: aggregate.weight, b_key: aggregate.bias}
        gradient = {
            k: update_as_gradient(sent[k].astype(np.float64), summed[k].astype(np.float64), lr)
            for k in sent
        }
        weights64 = {k: v.astype(np.float64) for k, v in sent.items()}
        path = self.run_dir / JOBS_DIR / _name(cohort, f"-{run.label}.npz")
        arrays = write_arrays(path, weights=weights64, gradient=gradient)
        view = ServerView({}, {}, self.layer, batch_size=batch_size, noise_std=noise_std or None)
        seed = self.seed * 7919 + cohort["round"] * 101 + COHORT
        config = PLANS[run.attack].settings(self.spec, run, seed)
        job = AttackJob(cohort["round"], COHORT, run.label, run.attack, arrays, view, config)
        return job, knowledge

    def _judge_cohort(
        self,
        out: AttackOutcome,
        base: dict[str, Any],
        members: list[tuple[dict[str, Any], np.ndarray]],
        run: str,
    ) -> None:
        """Score the attack on a sum: the cohort's record, and one per summed client with what
        of its own samples came back (each recovered sample goes to the client whose sample it
        was matched to)."""
        record = {**base, "seconds": out.seconds}
        per_client = [{**m, "attack": base["attack"], "seconds": out.seconds} for m, _ in members]
        if out.error is not None or out.inputs is None:
            for mine in per_client:
                self._write({**mine, "status": "refused", "reason": out.error})
            self._write({**record, "status": "refused", "reason": out.error}, run)
            return
        ids = np.concatenate([ids for _, ids in members]) if members else np.empty(0, np.int64)
        rec, truth, quality = self._score(out, ids)
        fields = self._attack_fields(out)
        start = 0
        for mine, (_, own) in zip(per_client, members, strict=True):
            part = slice(start, start + len(own))
            start += len(own)
            share = BatchQuality(
                match=quality.match[part],
                psnr=quality.psnr[part],
                mse=quality.mse[part],
                ssim=None if quality.ssim is None else quality.ssim[part],
            )
            mine |= {
                **fields,
                "certified": None,  # the attack certifies samples of the sum, not of a client
                **self._quality_fields(share, own),
                "knowledge": base["knowledge"],
                "cohort": {"clients": base["clients"], "batch_size": base["batch_size"]},
            }
            self._grid(mine, run, truth[part], rec, share)
            self._write(mine)
        record |= fields | self._quality_fields(quality, ids)
        record["share_certified"] = fields["certified"] / max(len(ids), 1)
        self._write(record, run)

    def _file_unjudged(self, out: AttackOutcome, record: dict[str, Any], run: str) -> None:
        """File a reconstruction that no ground truth judges: what the attack vouches for, the
        reconstruction itself and, for images, its grid."""
        summary = out.summary
        inputs = out.inputs if out.inputs is not None else np.zeros((0, 0))
        certified = out.certified if out.certified is not None else np.zeros(0, dtype=bool)
        name = _name(record, "")
        path = self.run_dir / RECONSTRUCTIONS_DIR / f"{name}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, inputs=inputs, certified=certified)
        record |= {
            "status": summary["status"],
            "reason": summary["reason"],
            "batch_size_estimated": summary["batch_size"],
            "batch_size_method": summary["batch_size_method"],
            "batch_size_confidence": summary.get("batch_size_confidence"),
            "noise_std_estimated": summary.get("noise_std_estimated"),
            "noise_std_used": summary.get("noise_std_used"),
            "undeclared_noise": summary.get("undeclared_noise"),
            "noise_note": summary.get("noise_note"),
            "columns_verified": summary["verified"],
            "certified": summary["certified"],
            # Of the estimated batch: the true size is the client's to know.
            "share_certified": summary["certified"] / max(summary["batch_size"], 1),
            "confidence_mean": summary["confidence_mean"],
            "timings": summary["timings"],
            "counts": summary["counts"],
            "reconstruction": f"{RECONSTRUCTIONS_DIR}/{name}.npz",
        }
        shape = self.input_shape
        if self.spec.grids and len(inputs) and shape is not None and len(shape) == 3:
            images = torch.from_numpy(inputs).reshape(-1, *shape)
            if self.normalization is not None:
                images = self.normalization.undo(images)
            else:  # unknown normalisation: each image stretched to [0, 1], to be seen at all
                low = images.amin(dim=(1, 2, 3), keepdim=True)
                images = (images - low) / (images.amax(dim=(1, 2, 3), keepdim=True) - low).clamp(
                    min=1e-12
                )
            grid = name + (".png" if run == "spearpp" else f"-{run}.png")
            save_row(images.numpy(), self.run_dir / GRID_DIR / grid)
            record["grid"] = f"{GRID_DIR}/{grid}"
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
