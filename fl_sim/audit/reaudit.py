"""``fl-sim audit RUN_DIR``: resume an interrupted audit, or redo it, from stored updates."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fl_sim.apps.server import attacked_layer
from fl_sim.audit.auditor import (
    AUDIT_FILE,
    PROXIES_FILE,
    PROXY_RUN,
    UPDATES_DIR,
    Auditor,
)
from fl_sim.audit.updates import load_update
from fl_sim.config import parse_scenario
from fl_sim.data.federated import federated_data
from fl_sim.forecast.table import record_run
from fl_sim.report.build import read_jsonl


def reaudit(run_dir: Path, redo: bool = False) -> int:
    """Attack the stored updates of ``run_dir`` that have no record yet, per attack (and
    compute missing proxies); all with ``redo`` (the earlier records are then kept in
    ``audit-<time>.jsonl`` and ``proxies-<time>.jsonl``). Returns how many updates were queued.

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
    audit_file, proxies_file = run_dir / AUDIT_FILE, run_dir / PROXIES_FILE
    if redo:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for path in (audit_file, proxies_file):
            if path.exists():
                path.rename(run_dir / f"{path.stem}-{stamp}.jsonl")
    done = {(r["round"], r["client"], record_run(r)) for r in read_jsonl(audit_file)}
    done |= {(r["round"], r["client"], PROXY_RUN) for r in read_jsonl(proxies_file)}
    data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
    auditor = Auditor(
        scenario.audit,
        data,
        run_dir,
        scenario.seed,
        architecture=scenario.model.build(data.description),
        layer=attacked_layer(scenario, data.description),
        done=done,
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
