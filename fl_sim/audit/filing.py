"""Filing what the audit's jobs bring back: each finished attack judged (ground truth enters
here, through the judge, after the attack returned) and written to ``audit.jsonl`` at once, each
proxy job to ``proxies.jsonl``; the jobs still in flight tracked, so that a stored update is
released once its last record is on file."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from fl_sim.audit.job import AttackOutcome
from fl_sim.audit.judge import Judge, Verdict
from fl_sim.audit.log import PROXY_RUN, AuditLog, attack_fields
from fl_sim.audit.proxy_job import ProxyOutcome
from fl_sim.executors.budget import GB
from fl_sim.rundir import REFUSED

# (round, client, run): a job in flight.
JobKey = tuple[int, int, str]


class Filing:
    """Where the audit's records go.

    Parameters
    ----------
    log
        The run's audit log.
    judge
        Ground truth, or ``None`` where the server does not hold the run's data: then records
        carry what the attack itself knows.
    keep_updates
        Keep each stored update after its last record (else it is deleted then).
    """

    def __init__(self, log: AuditLog, judge: Judge | None, keep_updates: bool) -> None:
        self.log = log
        self.judge = judge
        self.keep_updates = keep_updates
        self._lock = threading.Lock()
        # Records still to come, by (round, client, run).
        self._pending: dict[JobKey, dict[str, Any]] = {}

    def expect(self, run: str, record: dict[str, Any]) -> None:
        """A job of ``run`` on ``record``'s update is in flight (call before submitting it: its
        outcome may come back at once)."""
        with self._lock:
            self._pending[(record["round"], record["client"], run)] = record

    def pending(self) -> list[tuple[JobKey, dict[str, Any]]]:
        """The jobs still in flight, with the record each will complete."""
        with self._lock:
            return list(self._pending.items())

    def truth(self) -> Judge:
        """The judge, for the paths that the auditor opens only with the run's data."""
        if self.judge is None:
            raise ValueError("this part of the audit needs the run's data (ground truth)")
        return self.judge

    def failed(self, run: str, record: dict[str, Any], status: str, reason: str) -> None:
        """File the job of ``run`` on ``record``'s update as ended without an outcome."""
        row = {**record, "status": status, "reason": reason}
        if run == PROXY_RUN:
            self.write_proxies(row)
        else:
            self.write(row, run)

    def judged(self, out: AttackOutcome, base: dict[str, Any], ids: np.ndarray, run: str) -> None:
        """Have a finished attack judged against the samples the client trained on (without
        ground truth: filed as the attack left it); file it."""
        record = {**base, "seconds": out.seconds, **_memory_peak(out)}
        if out.error is not None or out.inputs is None:
            # What the attack learnt before refusing (its batch size estimate) stays a field.
            self.write({**record, **out.summary, "status": REFUSED, "reason": out.error}, run)
            return
        fields = attack_fields(out.summary, base.get("declared") or {})
        if self.judge is None:
            # Of the estimated batch: the true size is the client's to know.
            share = out.summary["certified"] / max(out.summary["batch_size"], 1)
            record |= fields | {"share_certified": share}
            certified = out.certified if out.certified is not None else np.zeros(0, dtype=bool)
            self.log.reconstruction(record, run, out.inputs, certified)
            self.write(record, run)
            return
        verdict = self.judge.judge(out, ids)
        record |= fields | dict(verdict.fields)
        if "label_values" in out.summary["settings"]:
            record["labels_recovered"] = out.summary["settings"]["label_values"]
        self._grid(record, run, verdict)
        self.write(record, run)

    def judged_cohort(
        self,
        out: AttackOutcome,
        base: dict[str, Any],
        members: list[tuple[dict[str, Any], np.ndarray]],
        run: str,
    ) -> None:
        """File the attack on a sum: the cohort's record, and one per summed client with what
        of its own samples came back."""
        record = {**base, "seconds": out.seconds, **_memory_peak(out)}
        per_client = [{**m, "attack": base["attack"], "seconds": out.seconds} for m, _ in members]
        if out.error is not None or out.inputs is None:
            for mine in per_client:
                self.write({**mine, "status": REFUSED, "reason": out.error})
            self.write({**record, "status": REFUSED, "reason": out.error}, run)
            return
        cohort, shares = self.truth().judge_cohort(out, [ids for _, ids in members])
        fields = attack_fields(out.summary, {})  # a sum of clients' updates: no one declared
        for mine, share in zip(per_client, shares, strict=True):
            mine |= {
                **fields,
                "certified": None,  # the attack certifies samples of the sum, not of a client
                **share.fields,
                "knowledge": base["knowledge"],
                "cohort": {"clients": base["clients"], "batch_size": base["batch_size"]},
            }
            self._grid(mine, run, share)
            self.write(mine)
        record |= fields | dict(cohort.fields)
        self.write(record, run)

    def _grid(self, record: dict[str, Any], run: str, verdict: Verdict) -> None:
        self.log.grid(record, run, verdict.truth, verdict.matched, self.truth().is_image)

    def proxies_done(self, out: ProxyOutcome, row: dict[str, Any]) -> None:
        """File a finished proxy job."""
        self.write_proxies(
            {**row, "status": "done", "seconds": out.seconds, "samples": out.samples}
        )

    def write(self, record: dict[str, Any], run: str | None = None) -> None:
        """Write ``record`` (the last of its job of ``run``, if given: the job is done)."""
        with self._lock:
            self.log.write(record, run)
            if run is not None:
                self._pending.pop((record["round"], record["client"], run), None)
                self.log.release_update(record, self._pending, self.keep_updates)

    def write_proxies(self, row: dict[str, Any]) -> None:
        """Write a proxy job's row: the job is done."""
        with self._lock:
            self.log.write_proxies(row)
            self._pending.pop((row["round"], row["client"], PROXY_RUN), None)
            self.log.release_update(row, self._pending, self.keep_updates)


def _memory_peak(out: AttackOutcome) -> dict[str, float]:
    """The worker's measured peak during the job, beside the estimate the record carries."""
    if out.memory_peak_bytes is None:
        return {}
    return {"memory_peak_gb": round(out.memory_peak_bytes / GB, 3)}
