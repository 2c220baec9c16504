"""What the audit does not hold: the client replies it was to attack that have no record (an
audit cut short by a crash, a kill or ``wait_s``), so no table is read as the whole federation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fl_sim.report.faults import round_ranges
from fl_sim.rundir import AUDIT, CLIENTS, SCENARIO, UPDATES_DIR, read_json, read_jsonl


def _targets(table: dict[str, Any], server_round: int, client: int) -> bool:
    rounds, clients = table.get("rounds") or (), table.get("clients") or ()
    return (not rounds or server_round in rounds) and (not clients or client in clients)


def unaudited(run_dir: Path) -> list[tuple[int, int]]:
    """(round, client) of each client reply of ``clients.jsonl`` that the audit targets (its
    rounds and clients, and those of an attack it lists) without a record in ``audit.jsonl``.

    Empty for runs that say neither (an audited Flower app of one's own keeps no
    ``clients.jsonl``) and for runs without an audit."""
    audit = read_json(run_dir / SCENARIO).get("typed", {}).get("audit")
    if not audit or not audit.get("enabled", True):
        return []
    tables = [audit.get(name) or {} for name in audit.get("attacks", ())]
    replies = {
        (int(r["round"]), int(r["client"]))
        for r in read_jsonl(run_dir / CLIENTS)
        if isinstance(r.get("client"), int) and r.get("round") is not None
    }
    expected = {
        (rnd, c)
        for rnd, c in replies
        if _targets(audit, rnd, c) and any(_targets(t, rnd, c) for t in tables or [{}])
    }
    recorded = {(int(r["round"]), int(r["client"])) for r in read_jsonl(run_dir / AUDIT)}
    return sorted(expected - recorded)


def coverage_note(run_dir: Path) -> str:
    """One paragraph naming what the audit does not hold ('' when it holds every reply)."""
    missing = unaudited(run_dir)
    if not missing:
        return ""
    clients = sorted({c for _, c in missing})
    per_client = "; ".join(
        f"client {c}: rounds {round_ranges([r for r, k in missing if k == c])}" for c in clients
    )
    resume = (
        f"`fl-sim audit {run_dir}` resumes it from the updates the run stored"
        if any((run_dir / UPDATES_DIR).glob("*.npz"))
        else "the run stored no updates to resume it from (audit.keep_updates = true stores them)"
    )
    return (
        f"Not audited: {len(missing)} client replies the audit targets have no record (the audit "
        f"did not finish; {resume}). The tables cover only the others. {per_client}."
    )
