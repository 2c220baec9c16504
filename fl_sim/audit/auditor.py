"""The audit at work during a run: every intercepted update becomes attack jobs beside the
federation (one per attack the audit runs on it), and every finished job one line of
``audit.jsonl``, written as soon as it is known. With ``proxies`` on, each attacked batch's
vulnerability proxies go to ``proxies.jsonl``, and at the end the per-round correlation of each
proxy with the optimisation attack's error to ``forecast.jsonl``.

Under SecAgg+ the server holds only each round's sum (:meth:`Auditor.queue_aggregate`): it is
attacked as one batch of every summed client's samples, and the judge files the cohort's
record and one per client with what of its own samples came back.

Ground truth enters only through the judge (:mod:`fl_sim.audit.judge`), after the attack
returned, and in the judge's own proxy jobs.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from attacks import ATTACKS
from clients.defences.base import EPSILON
from clients.reply import PARTITION_ID, REASON, SAMPLE_IDS, STATUS
from fl_sim.audit.job import AttackJob, AttackOutcome, write_arrays
from fl_sim.audit.judge import Judge, Verdict, sample_ids, true_batch_size
from fl_sim.audit.log import (
    COHORT,
    INTERRUPTED,
    PROXY_RUN,
    AuditLog,
    attack_fields,
    new_record,
    reply_record,
)
from fl_sim.audit.proxy_job import ProxyJob, ProxyOutcome, write_proxy_arrays
from fl_sim.audit.runs import AttackRun, audit_runs
from fl_sim.audit.threat_model import Sight, ThreatModel, next_layer_helps
from fl_sim.audit.updates import save_update
from fl_sim.config.federation import SecAggSpec
from fl_sim.config.schema import AuditSpec
from fl_sim.data.federated import FederatedData
from fl_sim.data.normalize import Normalization
from fl_sim.executors import EXECUTORS, ClusterSpec, WorkerJob
from fl_sim.model import array_keys, next_linear
from fl_sim.rundir import AGGREGATE_VIEW, COHORT_VIEW
from strategies import InterceptedAggregate, InterceptedUpdate, LeftOut


class Auditor:
    """Sink of the honest-but-curious strategy: queues the attacks on what it intercepts and
    files what they recover.

    What an attack is given is the threat model's (:class:`ThreatModel`), how it is scored the
    judge's (:class:`Judge`, ground truth), where it goes the audit log's (:class:`AuditLog`);
    the auditor wires them to the attack workers and keeps track of the jobs in flight.

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
        needs_truth = [a for a in spec.attacks if not ATTACKS[a].runs_without_truth]
        if data is None and (spec.proxies or needs_truth):
            raise ValueError(
                f"without ground truth only attacks that certify what they report can run: audit."
                f"attacks={list(spec.attacks)} and audit.proxies={spec.proxies} need the run's data"
            )
        self.spec = spec
        self.round_epsilon = round_epsilon
        self.judge = Judge(data, draws) if data is not None else None
        self.log = AuditLog(run_dir, behaviour, spec.grids, input_shape, normalization, lock=True)
        self.seed = seed
        self.done = frozenset(done)
        self.runs = audit_runs(spec)
        needs_model = spec.proxies or any(ATTACKS[r.attack].whole_model for r in self.runs)
        if needs_model and architecture is None:
            raise ValueError("the audit's attacks or proxies need the model's architecture")
        found = next_linear(architecture) if architecture is not None else None
        self.threat = ThreatModel(
            first_layer=layer,
            knows_batch_size=spec.knows_batch_size,
            knows_noise=spec.knows_noise,
            next_layer=array_keys(found[0]) if found else None,
            # Only the structure travels to the workers: a weightless copy on the meta device.
            architecture=copy.deepcopy(architecture).to("meta") if architecture else None,
            data=data.description if data is not None else None,
        )
        cluster = cluster or ClusterSpec()
        self._executor = EXECUTORS[cluster.attack_executor](spec.workers, cluster)
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
        return [r for r in self.runs if self.spec.covers(r.attack, server_round, client)]

    def keeps_whole(self, server_round: int, declared: Mapping[str, Any]) -> bool:
        """Whether this reply is needed whole: a whole-model attack or the proxies target it,
        or a first-layer attack that uses the next layer of a one-step DP update."""
        client = int(declared.get(PARTITION_ID, -1))
        runs = self.runs_for(server_round, client)
        return bool(runs) and (
            self.spec.proxies
            or any(ATTACKS[r.attack].whole_model for r in runs)
            or (self.threat.next_layer is not None and next_layer_helps(declared))
        )

    def queue(self, update: InterceptedUpdate) -> int:
        """Queue the attack (and proxy) jobs of an update; returns how many were queued."""
        base = self._base(update)
        if update.problem is not None:
            self._write(
                {**base, "attack": None, "status": update.failure, "reason": update.problem}
            )
            return 0
        runs = self.runs_for(base["round"], base["client"])
        todo = [r for r in runs if (base["round"], base["client"], r.label) not in self.done]
        # Kept on disk until its last job is recorded, so a hard kill loses no queued attack
        # (``fl-sim audit RUN_DIR`` resumes from it); kept for good with ``keep_updates``.
        if self.spec.keep_updates or todo:
            save_update(update, self.log.update_path(base))
        ids = sample_ids(update.audit)  # the judge keeps these, not the update's arrays
        queued = 0
        for run in todo:
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
                functools.partial(self._judged, base=record, ids=ids, run=run.label),
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

    def queue_aggregate(self, aggregate: InterceptedAggregate, secagg: SecAggSpec) -> int:
        """Queue the first-layer attacks on a SecAgg+ round's sum, as one batch of every summed
        client's samples; returns how many were queued.

        What the attack is told is the threat model's
        (:meth:`~fl_sim.audit.threat_model.ThreatModel.of_aggregate`). Whole-model attacks are
        not run on a sum of updates.
        """
        server_round = aggregate.server_round
        members = []
        for node, declared in zip(aggregate.node_ids, aggregate.declared, strict=True):
            client = int(declared.get(PARTITION_ID, node))
            ids = self.judge.drawn(client, server_round) if self.judge else np.empty(0, np.int64)
            audit = {SAMPLE_IDS: [int(i) for i in ids]}
            base = self._base_of(server_round, node, client, declared, audit)
            members.append(({**base, "view": AGGREGATE_VIEW}, ids))
        clients = [m["client"] for m, _ in members]
        cohort = {
            **new_record(server_round, COHORT, None, "secagg", None),
            "view": COHORT_VIEW,
            "clients": clients,
            "dropped_nodes": list(aggregate.dropped),
            "batch_size": int(sum(len(ids) for _, ids in members)),
        }
        runs = [
            r
            for r in self.runs
            if not ATTACKS[r.attack].whole_model
            and any(self.spec.covers(r.attack, server_round, c) for c in clients)
        ]
        queued = 0
        for run in runs:
            if (server_round, COHORT, run.label) in self.done:
                continue
            sight = self.threat.of_aggregate(aggregate, secagg)
            record = {**cohort, "attack": run.attack, "knowledge": dict(sight.knowledge)}
            self._submit(
                run.label,
                record,
                self._attack_job(sight, cohort, run),
                functools.partial(self._judged_cohort, base=record, members=members, run=run.label),
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
        if self.spec.proxies:
            self.log.write_forecast()
        self.log.close()

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
        epsilon = declared.get(EPSILON)
        if epsilon is None and self.round_epsilon is not None:
            epsilon = self.round_epsilon(server_round)
        epsilon = float(epsilon) if epsilon is not None else None
        return reply_record(
            server_round, node_id, client, declared, true_batch_size(audit), epsilon
        )

    def _truth(self) -> Judge:
        """The judge, for the paths that the constructor opens only with the run's data."""
        if self.judge is None:
            raise ValueError("this part of the audit needs the run's data (ground truth)")
        return self.judge

    def _job(
        self, update: InterceptedUpdate, base: Mapping[str, Any], run: AttackRun
    ) -> tuple[AttackJob, dict[str, str]]:
        """The attack's job on an update: what the threat model lets the attacker see and know
        (told the labels, with ``knows_labels``, by the judge); and that knowledge."""
        whole = ATTACKS[run.attack].whole_model
        labels = None
        if whole and self.spec.knows_labels:
            labels = self._truth().labels(sample_ids(update.audit))
        sight = self.threat.of_update(update, whole_model=whole, labels=labels)
        return self._attack_job(sight, base, run), dict(sight.knowledge)

    def _attack_job(self, sight: Sight, base: Mapping[str, Any], run: AttackRun) -> AttackJob:
        """The job of ``run`` on what ``sight`` shows: its arrays to a file the worker reads,
        the rest of the view in the job."""
        view = sight.view
        arrays = write_arrays(self.log.job_path(base, run.label), view.weights, view.gradient)
        seed = self.seed * 7919 + base["round"] * 101 + base["client"]
        config = run.config(self.spec, seed)
        view = dataclasses.replace(view, weights={}, gradient={})
        return AttackJob(
            base["round"], base["client"], run.label, ATTACKS[run.attack], arrays, view, config
        )

    def _proxy_job(self, update: InterceptedUpdate, base: Mapping[str, Any]) -> ProxyJob:
        sent_all, _ = update.whole()
        architecture = self.threat.architecture
        if architecture is None:  # the constructor refuses proxies without one
            raise ValueError("the proxies need the model's architecture")
        ids = sample_ids(update.audit)
        inputs, labels = self._truth().inputs(ids)
        path = write_proxy_arrays(
            self.log.job_path(base, PROXY_RUN), dict(sent_all), inputs, labels, ids
        )
        return ProxyJob(
            base["round"],
            base["client"],
            path,
            architecture,
            self.spec.proxy_tol,
            self.spec.proxy_max_iter,
            self.seed * 7919 + base["round"] * 101 + base["client"],
        )

    def _judged(self, out: AttackOutcome, base: dict[str, Any], ids: np.ndarray, run: str) -> None:
        """Have a finished attack judged against the samples the client trained on (without
        ground truth: filed as the attack left it); file it."""
        record = {**base, "seconds": out.seconds}
        if out.error is not None or out.inputs is None:
            self._write({**record, "status": "refused", "reason": out.error}, run)
            return
        fields = attack_fields(out.summary)
        if self.judge is None:
            # Of the estimated batch: the true size is the client's to know.
            share = out.summary["certified"] / max(out.summary["batch_size"], 1)
            record |= fields | {"share_certified": share}
            certified = out.certified if out.certified is not None else np.zeros(0, dtype=bool)
            self.log.reconstruction(record, run, out.inputs, certified)
            self._write(record, run)
            return
        verdict = self.judge.judge(out, ids)
        record |= fields | dict(verdict.fields)
        if "label_values" in out.summary["settings"]:
            record["labels_recovered"] = out.summary["settings"]["label_values"]
        self._grid(record, run, verdict)
        self._write(record, run)

    def _judged_cohort(
        self,
        out: AttackOutcome,
        base: dict[str, Any],
        members: list[tuple[dict[str, Any], np.ndarray]],
        run: str,
    ) -> None:
        """File the attack on a sum: the cohort's record, and one per summed client with what
        of its own samples came back."""
        record = {**base, "seconds": out.seconds}
        per_client = [{**m, "attack": base["attack"], "seconds": out.seconds} for m, _ in members]
        if out.error is not None or out.inputs is None:
            for mine in per_client:
                self._write({**mine, "status": "refused", "reason": out.error})
            self._write({**record, "status": "refused", "reason": out.error}, run)
            return
        cohort, shares = self._truth().judge_cohort(out, [ids for _, ids in members])
        fields = attack_fields(out.summary)
        for mine, share in zip(per_client, shares, strict=True):
            mine |= {
                **fields,
                "certified": None,  # the attack certifies samples of the sum, not of a client
                **share.fields,
                "knowledge": base["knowledge"],
                "cohort": {"clients": base["clients"], "batch_size": base["batch_size"]},
            }
            self._grid(mine, run, share)
            self._write(mine)
        record |= fields | dict(cohort.fields)
        self._write(record, run)

    def _grid(self, record: dict[str, Any], run: str, verdict: Verdict) -> None:
        self.log.grid(record, run, verdict.truth, verdict.matched, self._truth().is_image)

    def _proxies_done(self, out: ProxyOutcome, row: dict[str, Any]) -> None:
        self._write_proxies(
            {**row, "status": "done", "seconds": out.seconds, "samples": out.samples}
        )

    def _write(self, record: dict[str, Any], run: str | None = None) -> None:
        with self._lock:
            self.log.write(record, run)
            if run is not None:
                self._pending.pop((record["round"], record["client"], run), None)
                self.log.release_update(record, self._pending, self.spec.keep_updates)

    def _write_proxies(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.log.write_proxies(row)
            self._pending.pop((row["round"], row["client"], PROXY_RUN), None)
            self.log.release_update(row, self._pending, self.spec.keep_updates)
