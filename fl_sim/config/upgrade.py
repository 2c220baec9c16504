"""Settings stored by runs of earlier layouts, read in today's: what ``fl-sim audit RUN_DIR``
resumes from (``scenario.json``, ``audited.json``). Only stored files are upgraded; a config
written today in an old layout is refused with a message naming the new key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fl_sim.config.schema import AuditSpec


def upgraded_audit(audit: Mapping[str, Any]) -> dict[str, Any]:
    """An ``[audit]`` table with SPEAR++'s budget moved into ``[audit.spearpp]``, where it went
    when each attack got a table of its own."""
    table = dict(audit)
    moved = {key: table.pop(key) for key in AuditSpec.moved if key in table}
    if moved:
        table["spearpp"] = {**table.get("spearpp", {}), **moved}
    return table


def upgraded_scenario(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stored scenario (``scenario.json``'s ``resolved``) in today's layout."""
    scenario = dict(raw)
    if isinstance(scenario.get("audit"), Mapping):
        scenario["audit"] = upgraded_audit(scenario["audit"])
    return scenario
