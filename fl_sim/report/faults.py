"""The clients a run left out of aggregation, from ``clients.jsonl``: who, in which rounds,
and why."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from clients.reply import LEFT_OUT


def left_out(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``clients.jsonl`` whose reply was left out of aggregation."""
    return [r for r in rows if r.get("status") in LEFT_OUT]


def round_ranges(rounds: list[int]) -> str:
    """``[1, 2, 3, 5]`` as ``1-3, 5``."""
    spans: list[list[int]] = []
    for r in sorted(set(rounds)):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def left_out_table(rows: list[dict[str, Any]]) -> str:
    """Per client and status: the rounds it was left out and the last reason given ('' when
    every reply was aggregated)."""
    groups: dict[tuple[bool, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in left_out(rows):
        # An error reply from a node never heard of names no client: it goes by its node id.
        client = r.get("client")
        number = client if isinstance(client, int) else int(r.get("node_id") or 0)
        groups[(not isinstance(client, int), number, str(r["status"]))].append(r)
    if not groups:
        return ""
    header = f"{'client':>6}  {'status':<12} {'rounds':<14} reason (last)"
    lines = [header, "-" * 80]
    for (unknown, number, status), group in sorted(groups.items()):
        who = f"node {number}" if unknown else str(number)
        rounds = [int(r["round"]) for r in group if r.get("round") is not None]
        spans = f"{round_ranges(rounds)} ({len(group)})"
        last = max(group, key=lambda r: r.get("round") or 0)
        lines.append(f"{who:>6}  {status:<12} {spans:<14} {last.get('reason', '')}")
    return "\n".join(lines)
