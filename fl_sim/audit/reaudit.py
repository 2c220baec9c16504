"""``fl-sim audit RUN_DIR``: resume an interrupted audit, or redo it, from stored updates."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fl_sim.audit.auditor import AUDIT_FILE, UPDATES_DIR, Auditor, load_update
from fl_sim.config import parse_scenario
from fl_sim.data.federated import federated_data
from fl_sim.report.build import read_jsonl


def reaudit(run_dir: Path, redo: bool = False) -> int:
    """Attack the stored updates of ``run_dir`` that have no record yet (all with ``redo``;
    the earlier records are then kept in ``audit-<time>.jsonl``). Returns how many were queued.

    Raises
    ------
    FileNotFoundError
        When the run kept no updates (``[audit] keep_updates = true`` keeps them).
    """
    stored = sorted((run_dir / UPDATES_DIR).glob("r*-c*.npz"))
    if not stored:
        raise FileNotFoundError(
            f"{run_dir / UPDATES_DIR} holds no updates: run with --set audit.keep_updates=true"
        )
    raw = json.loads((run_dir / "scenario.json").read_text())["resolved"]
    scenario = parse_scenario(raw)
    audit_file = run_dir / AUDIT_FILE
    if redo and audit_file.exists():
        audit_file.rename(run_dir / f"audit-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    done = {(r["round"], r["client"]) for r in read_jsonl(audit_file)}
    data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
    auditor = Auditor(scenario.audit, data, run_dir, scenario.seed, scenario.cluster)
    queued = 0
    try:
        for path in stored:
            update = load_update(path)
            key = (update.server_round, int(update.declared.get("partition-id", update.node_id)))
            if key not in done:
                auditor(update)
                queued += 1
    finally:
        auditor.finish()
    return queued
