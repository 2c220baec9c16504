"""``fl-sim audit RUN_DIR``: resume an interrupted audit, or redo it, from stored updates: of a
run of fl-sim's own federation (``fl-sim run`` or ``flwr run``, its ``scenario.json``) or of a
Flower app of one's own audited by AuditedStrategy (its ``audited.json``, no ground truth)."""

from __future__ import annotations

from pathlib import Path

from fl_sim import rundir
from fl_sim.audit.auditor import Auditor
from fl_sim.audit.context import AuditContext
from fl_sim.audit.log import AuditLog
from fl_sim.audit.updates import stored_updates


def reaudit(run_dir: Path, redo: bool = False, max_memory_gb: float | None = None) -> int:
    """Attack the stored updates of ``run_dir`` that have no record yet, or only one of an
    attack cut short (interrupted, timed out, over the memory budget: that record is replaced),
    per attack (and compute missing proxies); all with ``redo`` (the earlier records are then
    kept in ``audit-<time>.jsonl`` and ``proxies-<time>.jsonl``); with ``max_memory_gb``, under
    that memory budget instead of the run's. Returns how many updates were queued.

    Raises
    ------
    FileNotFoundError
        When the run holds no updates (each is stored while its attacks are queued, and kept
        after with ``[audit] keep_updates = true``), or says neither how its federation nor
        how its audit was run.
    """
    log = AuditLog(run_dir)
    stored = log.stored_updates()
    if not stored:
        raise FileNotFoundError(
            f"{run_dir / rundir.UPDATES_DIR} holds no updates: its audit finished (to redo an "
            "audit, run with --set audit.keep_updates=true)"
        )
    context = AuditContext.stored(run_dir)  # before set_aside: a run that says nothing stays
    if max_memory_gb is not None:
        context = context.with_memory_budget(max_memory_gb)
    if redo:
        log.set_aside()
    auditor, queued = resumed_auditor(context, log)
    auditor.finish()
    return queued


def resumed_auditor(
    context: AuditContext, log: AuditLog, through_round: int | None = None
) -> tuple[Auditor, int]:
    """An auditor that skips what ``log`` has on file, with the stored updates (of rounds up to
    ``through_round``, all by default) queued again where a job has no record or was cut short
    (that record is replaced); returns it and how many updates were queued. A failure while
    queueing finishes the auditor before it is raised."""
    auditor = Auditor(context.resumed(log.done()))  # holds the run's audit lock from here
    log.forget_cut_short()  # the jobs cut short are redone: one record each
    queued = 0
    try:
        for update in stored_updates(log.stored_updates()):
            if through_round is None or update.server_round <= through_round:
                queued += auditor.queue(update) > 0
    except BaseException:
        auditor.finish()
        raise
    return auditor, queued
