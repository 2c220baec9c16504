"""What the audit does not hold: the client replies it was to attack that have no record (an
audit cut short by a crash, a kill or ``wait_s``), and per client the replies it holds no
finished attack of, with the reason, so no table is read as the whole federation."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_sim.report.faults import round_ranges
from fl_sim.rundir import (
    AUDIT,
    CHECKPOINT,
    CLIENTS,
    COHORT_VIEW,
    ERROR,
    INTERRUPTED,
    OUT_OF_MEMORY,
    REFUSED,
    RESUMABLE,
    ROUNDS,
    SCENARIO,
    TIMEOUT,
    UPDATES_DIR,
    read_json,
    read_jsonl,
)

# Statuses of a record whose attack never finished (the others are attacks' verdicts); a record
# without an attack is a reply left out of aggregation or one the server could not read.
UNFINISHED = frozenset({INTERRUPTED, TIMEOUT, OUT_OF_MEMORY, ERROR, REFUSED})
# Why a reply has no finished attack, besides its records' statuses.
NO_RECORD = "no record"
NOT_SCHEDULED = "not scheduled"


def _targets(table: dict[str, Any], server_round: int, client: int) -> bool:
    rounds, clients = table.get("rounds") or (), table.get("clients") or ()
    return (not rounds or server_round in rounds) and (not clients or client in clients)


def _replies(run_dir: Path) -> tuple[set[tuple[int, int]], set[tuple[int, int]]] | None:
    """(round, client) of every client reply of ``clients.jsonl``, and of those the audit
    targets (its rounds and clients, and those of an attack it lists); None for runs that say
    neither (an audited Flower app of one's own keeps no ``clients.jsonl``) and for runs
    without an audit."""
    audit = read_json(run_dir / SCENARIO).get("typed", {}).get("audit")
    if not audit or not audit.get("enabled", True):
        return None
    tables = [audit.get(name) or {} for name in audit.get("attacks", ())]
    replies = {
        (int(r["round"]), int(r["client"]))
        for r in read_jsonl(run_dir / CLIENTS)
        if isinstance(r.get("client"), int) and r.get("round") is not None
    }
    targeted = {
        (rnd, c)
        for rnd, c in replies
        if _targets(audit, rnd, c) and any(_targets(t, rnd, c) for t in tables or [{}])
    }
    return replies, targeted


def unaudited(run_dir: Path) -> list[tuple[int, int]]:
    """(round, client) of each client reply that the audit targets without a record in
    ``audit.jsonl`` (empty where :func:`_replies` is None)."""
    found = _replies(run_dir)
    if found is None:
        return []
    recorded = {(int(r["round"]), int(r["client"])) for r in read_jsonl(run_dir / AUDIT)}
    return sorted(found[1] - recorded)


@dataclass(frozen=True)
class ClientCoverage:
    """What the audit holds of one client: ``replies`` the server got (one per round),
    ``audited`` those with a finished attack, and per reason the rounds of the rest
    (``not_audited``: an unfinished attack's status, a left-out reply's status, ``no record``
    for a reply the audit targets but never filed, ``not scheduled`` for one it does not
    target)."""

    client: int
    replies: int
    audited: int
    not_audited: dict[str, list[int]]


def client_coverage(run_dir: Path) -> list[ClientCoverage]:
    """Per client, in order, what the audit holds (empty where :func:`_replies` is None)."""
    found = _replies(run_dir)
    if found is None:
        return []
    replies, targeted = found
    statuses: dict[tuple[int, int], set[str]] = defaultdict(set)
    for r in read_jsonl(run_dir / AUDIT):
        if r.get("view") != COHORT_VIEW and isinstance(r.get("client"), int):
            finished = r.get("attack") is not None and r.get("status") not in UNFINISHED
            statuses[(int(r["round"]), r["client"])].add("" if finished else str(r["status"]))
    rows = []
    for client in sorted({c for _, c in replies}):
        audited = 0
        missing: dict[str, list[int]] = defaultdict(list)
        for rnd in sorted(r for r, c in replies if c == client):
            seen = statuses.get((rnd, client))
            if seen and "" in seen:
                audited += 1
            elif seen:
                missing[", ".join(sorted(seen))].append(rnd)
            else:
                missing[NO_RECORD if (rnd, client) in targeted else NOT_SCHEDULED].append(rnd)
        count = sum(1 for _, c in replies if c == client)
        rows.append(ClientCoverage(client, count, audited, dict(missing)))
    return rows


def coverage_table(rows: list[ClientCoverage]) -> str:
    """Per client: replies, audited, and the rounds not audited by reason ('' when every
    reply of every client was audited)."""
    if all(r.audited == r.replies for r in rows):
        return ""
    header = f"{'client':>6}  {'replies':>7} {'audited':>7}  not audited (rounds, by reason)"
    lines = [header, "-" * 80]
    for r in rows:
        reasons = "; ".join(
            f"{reason}: {round_ranges(rounds)}" for reason, rounds in r.not_audited.items()
        )
        lines.append(f"{r.client:>6}  {r.replies:>7} {r.audited:>7}  {reasons or '-'}")
    totals = Counter(reason for r in rows for reason, rnds in r.not_audited.items() for _ in rnds)
    lines.append(
        f"{sum(r.audited for r in rows)} of {sum(r.replies for r in rows)} replies audited; "
        + ", ".join(f"{n} {reason}" for reason, n in sorted(totals.items()))
    )
    return "\n".join(lines)


def _federation_unfinished(run_dir: Path) -> bool:
    """Whether an fl-sim federation stopped before its last round with a round to go on from."""
    planned = read_json(run_dir / SCENARIO).get("typed", {}).get("rounds")
    done = max((int(r["round"]) for r in read_jsonl(run_dir / ROUNDS)), default=0)
    return (run_dir / CHECKPOINT).is_file() and isinstance(planned, int) and done < planned


def coverage_note(run_dir: Path) -> str:
    """One paragraph naming what the audit does not hold and how to resume it ('' when it
    holds a finished attack of every reply it targets)."""
    missing = unaudited(run_dir)
    cut = [r for r in read_jsonl(run_dir / AUDIT) if r.get("status") in RESUMABLE]
    if not missing and not cut:
        return ""
    if _federation_unfinished(run_dir):
        resume = f"`fl-sim run --resume {run_dir}` goes on with the federation and its audit"
    elif any((run_dir / UPDATES_DIR).glob("*.npz")):
        resume = f"`fl-sim audit {run_dir}` resumes it from the updates the run stored"
    else:
        resume = (
            "the run stored no updates to resume it from (audit.keep_updates = true stores them)"
        )
    parts = []
    if missing:
        clients = sorted({c for _, c in missing})
        per_client = "; ".join(
            f"client {c}: rounds {round_ranges([r for r, k in missing if k == c])}" for c in clients
        )
        parts.append(
            f"{len(missing)} client replies the audit targets have no record ({per_client})"
        )
    over = [r for r in cut if r.get("status") == OUT_OF_MEMORY]
    if len(cut) > len(over):
        parts.append(f"attacks cut short (interrupted or timed out): {len(cut) - len(over)}")
    if over:
        largest = max(float(r.get("memory_estimate_gb") or 0) for r in over)
        parts.append(
            f"attacks over the memory budget: {len(over)}, estimated at up to {largest:.2f} GB "
            "each beside the idle workers (`fl-sim audit RUN_DIR --max-memory-gb GB` redoes "
            "them under a larger budget)"
        )
    return (
        f"Not audited: {' and '.join(parts)}: the audit did not finish; {resume}. The tables "
        "cover only the others."
    )
