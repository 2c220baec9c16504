"""``fl-sim audit RUN_DIR``: resume an interrupted audit, or redo it, from stored updates."""

from __future__ import annotations

from pathlib import Path

from fl_sim import rundir
from fl_sim.apps.server import attacked_layer
from fl_sim.audit.auditor import Auditor
from fl_sim.audit.log import AuditLog
from fl_sim.audit.updates import load_update
from fl_sim.config import parse_scenario
from fl_sim.data.federated import federated_data


def reaudit(run_dir: Path, redo: bool = False) -> int:
    """Attack the stored updates of ``run_dir`` that have no record yet, per attack (and
    compute missing proxies); all with ``redo`` (the earlier records are then kept in
    ``audit-<time>.jsonl`` and ``proxies-<time>.jsonl``). Returns how many updates were queued.

    Raises
    ------
    FileNotFoundError
        When the run kept no updates (``[audit] keep_updates = true`` keeps them), or has no
        scenario to resume.
    """
    log = AuditLog(run_dir)
    stored = log.stored_updates()
    if not stored:
        raise FileNotFoundError(
            f"{run_dir / rundir.UPDATES_DIR} holds no updates: run with "
            "--set audit.keep_updates=true"
        )
    raw = rundir.read_json(run_dir / rundir.SCENARIO).get("resolved")
    if raw is None:
        raise FileNotFoundError(f"{run_dir / rundir.SCENARIO}: no scenario to resume")
    scenario = parse_scenario(raw)
    if redo:
        log.set_aside()
    data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
    auditor = Auditor(
        scenario.audit,
        data,
        run_dir,
        scenario.seed,
        architecture=scenario.model.build(data.description),
        layer=attacked_layer(scenario, data.description),
        done=log.done(),
        cluster=scenario.cluster,
        behaviour=scenario.server.behaviour.behaviour,
    )
    queued = 0
    try:
        for path in stored:
            queued += auditor.queue(load_update(path)) > 0
    finally:
        auditor.finish()
    return queued
