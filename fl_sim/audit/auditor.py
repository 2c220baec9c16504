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
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from attacks import ATTACKS
from clients.defences.base import BATCH_SIZE, EPSILON, declared_count, declared_id
from clients.reply import PARTITION_ID, SAMPLE_IDS
from fl_sim.audit.context import AuditContext
from fl_sim.audit.filing import Filing
from fl_sim.audit.job import AttackJob, write_arrays
from fl_sim.audit.judge import Judge, sample_ids, true_batch_size
from fl_sim.audit.log import COHORT, PROXY_RUN, AuditLog, new_record, reply_record
from fl_sim.audit.proxy_job import ProxyJob, proxy_peak_bytes, write_proxy_arrays
from fl_sim.audit.runs import AttackRun, audit_runs
from fl_sim.audit.threat_model import Sight, ThreatModel, next_layer_helps
from fl_sim.audit.updates import save_update
from fl_sim.config.federation import SecAggSpec
from fl_sim.executors import EXECUTORS, WorkerJob
from fl_sim.executors.budget import (
    MemoryBudget,
    OverBudgetError,
    budget_bytes,
    worker_peak_gb,
)
from fl_sim.model import array_keys, next_linear
from fl_sim.progress import RunProgress
from fl_sim.rundir import (
    AGGREGATE_VIEW,
    COHORT_VIEW,
    ERROR,
    INTERRUPTED,
    OUT_OF_MEMORY,
    REFUSED,
    TIMEOUT,
)
from strategies import InterceptedAggregate, InterceptedUpdate, LeftOut, UpdateSink

# While the attacks queued by the last rounds finish, how often the caller hears how long is left.
WAITING_EVERY_S = 30.0


class Auditor:
    """Sink of the honest-but-curious strategy: queues the attacks on what it intercepts and
    files what they recover.

    What an attack is given is the threat model's (:class:`ThreatModel`), how it is scored the
    judge's (:class:`Judge`, ground truth), where it goes the audit log's (:class:`AuditLog`);
    the auditor wires them to the attack workers and keeps track of the jobs in flight.

    Parameters
    ----------
    context
        What the audit runs with (:class:`~fl_sim.audit.context.AuditContext`).
    """

    def __init__(self, context: AuditContext) -> None:
        spec, data, architecture = context.spec, context.data, context.architecture
        needs_truth = [a for a in spec.attacks if not ATTACKS[a].runs_without_truth]
        if data is None and (spec.proxies or needs_truth):
            raise ValueError(
                f"without ground truth only attacks that certify what they report can run: audit."
                f"attacks={list(spec.attacks)} and audit.proxies={spec.proxies} need the run's data"
            )
        self.spec = spec
        self.round_epsilon = context.round_epsilon
        self.judge = Judge(data, context.draws) if data is not None else None
        self.log = AuditLog(
            context.run_dir,
            context.behaviour,
            spec.grids,
            context.input_shape,
            context.normalization,
            lock=True,
        )
        self.seed = context.seed
        self.done = context.done
        self.runs = audit_runs(spec)
        needs_model = spec.proxies or any(ATTACKS[r.attack].whole_model for r in self.runs)
        if needs_model and architecture is None:
            raise ValueError("the audit's attacks or proxies need the model's architecture")
        found = next_linear(architecture) if architecture is not None else None
        self.threat = ThreatModel(
            first_layer=context.layer,
            knows_batch_size=spec.knows_batch_size,
            knows_noise=spec.knows_noise,
            next_layer=array_keys(found[0]) if found else None,
            # Only the structure travels to the workers: a weightless copy on the meta device.
            architecture=copy.deepcopy(architecture).to("meta") if architecture else None,
            data=data.description if data is not None else None,
        )
        cluster = context.cluster
        executor = EXECUTORS[cluster.attack_executor](spec.workers, cluster)
        if executor.on_this_machine:
            budget = budget_bytes(spec.max_memory_gb)
            executor = MemoryBudget(executor, budget, spec.workers)
        self._executor = executor
        self.filing = Filing(self.log, self.judge, spec.keep_updates)

    def __call__(self, update: InterceptedUpdate) -> None:
        """File an update: rejected at once if unusable, else queued for attack."""
        self.queue(update)

    def left_out(self, fault: LeftOut) -> None:
        """File a reply the server left out of aggregation: one record, never attacked, with
        the fault's status (``diverged``, ``client-error``, ``rejected``) and reason."""
        client = fault.client if fault.client is not None else fault.node_id
        base = self._base_of(fault.server_round, fault.node_id, client, fault.declared, fault.audit)
        self.filing.write({**base, "attack": None, "status": fault.status, "reason": fault.reason})

    def runs_for(self, server_round: int, client: int) -> list[AttackRun]:
        """The attacks the audit runs on this client's update of this round."""
        return [r for r in self.runs if self.spec.covers(r.attack, server_round, client)]

    def keeps_whole(self, server_round: int, declared: Mapping[str, Any]) -> bool:
        """Whether this reply is needed whole: a whole-model attack or the proxies target it,
        or a first-layer attack that uses the next layer of a one-step DP update."""
        client = declared_id(declared, PARTITION_ID, -1)
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
            self.filing.write(
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
                self.filing.write(
                    {**record, "status": REFUSED, "reason": "the update was not kept whole"},
                    run.label,
                )
                continue
            job, knowledge = self._job(update, base, run)
            record["knowledge"] = knowledge
            self._submit(
                run.label,
                record,
                job,
                functools.partial(self.filing.judged, base=record, ids=ids, run=run.label),
            )
            queued += 1
        key = (base["round"], base["client"], PROXY_RUN)
        if self.spec.proxies and runs and key not in self.done:
            if update.sent_arrays is None:
                self.filing.write_proxies({**base, "status": REFUSED, "reason": "not kept whole"})
            else:
                row = {k: base[k] for k in ("round", "client", "node_id", "defence")}
                self._submit(
                    PROXY_RUN,
                    row,
                    self._proxy_job(update, base),
                    functools.partial(self.filing.proxies_done, row=row),
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
            client = declared_id(declared, PARTITION_ID, node)
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
                functools.partial(
                    self.filing.judged_cohort, base=record, members=members, run=run.label
                ),
            )
            queued += 1
        return queued

    def finish(
        self, interrupted: bool = False, waiting: Callable[[float], None] | None = None
    ) -> None:
        """Wait (up to ``wait_s`` in all) for queued jobs; record the rest as timed out; then
        write the per-round correlations of the proxies (``forecast.jsonl``). While it waits,
        ``waiting`` is told the seconds left every :data:`WAITING_EVERY_S`.

        With ``interrupted`` (the run was stopped) nothing is waited for: the jobs still
        running are stopped and recorded as ``interrupted``.
        """
        if not interrupted:
            deadline = time.monotonic() + self.spec.wait_s
            while not self._executor.wait(min(WAITING_EVERY_S, deadline - time.monotonic())):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if waiting is not None:
                    waiting(left)
        self._executor.close()  # no outcome comes back after this
        for (_, _, run), record in self.filing.pending():
            if interrupted:
                reason = "the run was interrupted before this job finished"
                self.filing.failed(run, record, INTERRUPTED, reason)
            else:
                reason = f"not finished {self.spec.wait_s:.0f} s after the last round"
                self.filing.failed(run, record, TIMEOUT, reason)
        if self.spec.proxies:
            self.log.write_forecast()
        self.log.close()

    # -- internals -------------------------------------------------------------------------

    def _submit(
        self, run: str, record: dict[str, Any], job: WorkerJob, callback: Callable[[Any], None]
    ) -> None:
        # Every record says what its job was estimated to take (and, once done, what it took).
        record["memory_estimate_gb"] = worker_peak_gb(job.peak_bytes)

        def failed(err: BaseException) -> None:
            status = OUT_OF_MEMORY if isinstance(err, OverBudgetError) else ERROR
            reason = str(err) if status == OUT_OF_MEMORY else f"{type(err).__name__}: {err}"
            self.filing.failed(run, record, status, reason)

        self.filing.expect(run, record)
        self._executor.submit(job, on_outcome=callback, on_error=failed)

    def _base(self, update: InterceptedUpdate) -> dict[str, Any]:
        declared = update.declared
        client = declared_id(declared, PARTITION_ID, update.node_id)
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

    def _job(
        self, update: InterceptedUpdate, base: Mapping[str, Any], run: AttackRun
    ) -> tuple[AttackJob, dict[str, str]]:
        """The attack's job on an update: what the threat model lets the attacker see and know
        (told the labels, with ``knows_labels``, by the judge); and that knowledge."""
        whole = ATTACKS[run.attack].whole_model
        labels = None
        if whole and self.spec.knows_labels:
            labels = self.filing.truth().labels(sample_ids(update.audit))
        sight = self.threat.of_update(update, whole_model=whole, labels=labels)
        return self._attack_job(sight, base, run), dict(sight.knowledge)

    def _attack_job(self, sight: Sight, base: Mapping[str, Any], run: AttackRun) -> AttackJob:
        """The job of ``run`` on what ``sight`` shows: its arrays to a file the worker reads,
        the rest of the view in the job."""
        view = sight.view
        arrays = write_arrays(self.log.job_path(base, run.label), view.weights, view.gradient)
        config = run.config(self.spec, self._job_seed(base))
        attack = ATTACKS[run.attack]
        # Scheduling is not attacking: the batch size a client declares in the clear bounds the
        # estimate even where the attack is not told it (else B is bounded by the layer).
        size = view.batch_size or declared_count(base.get("declared") or {}, BATCH_SIZE)
        peak = attack.peak_bytes(dataclasses.replace(view, batch_size=size), config)
        view = dataclasses.replace(view, weights={}, gradient={})
        return AttackJob(
            base["round"], base["client"], run.label, attack, arrays, view, config, peak
        )

    def _proxy_job(self, update: InterceptedUpdate, base: Mapping[str, Any]) -> ProxyJob:
        sent_all, _ = update.whole()
        architecture = self.threat.architecture
        if architecture is None:  # the constructor refuses proxies without one
            raise ValueError("the proxies need the model's architecture")
        ids = sample_ids(update.audit)
        inputs, labels = self.filing.truth().inputs(ids)
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
            self._job_seed(base),
            proxy_peak_bytes(dict(sent_all), inputs),
        )

    def _job_seed(self, base: Mapping[str, Any]) -> int:
        # One seed per (run, round, client), the same when a resumed audit redoes the job.
        return int(self.seed * 7919 + base["round"] * 101 + base["client"])


def counted(auditor: Auditor, progress: RunProgress | None) -> UpdateSink:
    """The auditor as a strategy's sink, telling ``progress`` how many jobs each update
    queued."""
    if progress is None:
        return auditor

    def queue(update: InterceptedUpdate) -> None:
        progress.attacks_queued(auditor.queue(update))

    return queue
