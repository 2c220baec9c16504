"""``fl-sim audit RUN_DIR``: resume an interrupted audit, or redo it, from stored updates: of a
run of fl-sim's own federation (``fl-sim run`` or ``flwr run``, its ``scenario.json``) or of a
Flower app of one's own audited by AuditedStrategy (its ``audited.json``, no ground truth)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fl_sim import rundir
from fl_sim.audit.audited import resumed_auditor
from fl_sim.audit.auditor import Auditor
from fl_sim.audit.log import AuditLog
from fl_sim.audit.updates import load_update
from fl_sim.config import parse_scenario
from fl_sim.config.upgrade import upgraded_scenario
from fl_sim.data.federated import federated_data


def reaudit(run_dir: Path, redo: bool = False) -> int:
    """Attack the stored updates of ``run_dir`` that have no record yet, per attack (and
    compute missing proxies); all with ``redo`` (the earlier records are then kept in
    ``audit-<time>.jsonl`` and ``proxies-<time>.jsonl``). Returns how many updates were queued.

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
    raw = rundir.read_json(run_dir / rundir.SCENARIO).get("resolved")
    if raw is None and not (run_dir / rundir.AUDITED).is_file():
        raise FileNotFoundError(
            f"{run_dir} has neither {rundir.SCENARIO} nor {rundir.AUDITED}: nothing says how "
            "it was audited"
        )
    if redo:
        log.set_aside()
    auditor = resumed_auditor(run_dir, log.done()) if raw is None else _auditor(run_dir, raw, log)
    queued = 0
    try:
        for path in stored:
            queued += auditor.queue(load_update(path)) > 0
    finally:
        auditor.finish()
    return queued


def _auditor(run_dir: Path, raw: dict[str, Any], log: AuditLog) -> Auditor:
    """The auditor of a run of fl-sim's own federation, from its resolved scenario."""
    scenario = parse_scenario(upgraded_scenario(raw))
    data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
    return Auditor(
        scenario.audit,
        data,
        run_dir,
        scenario.seed,
        architecture=scenario.model.build(data.description),
        layer=scenario.model.attacked_layer(data.description),
        done=log.done(),
        cluster=scenario.cluster,
        behaviour=scenario.server.behaviour.behaviour,
    )
