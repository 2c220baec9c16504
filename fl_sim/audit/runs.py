"""The attack runs an audit asks for: each listed attack once per variant (the optimisation
attack once per loss), with the settings its plugin makes of its table. Read from the plugins,
never from attack names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attacks import ATTACKS
from fl_sim.config.schema import AuditSpec


@dataclass(frozen=True)
class AttackRun:
    """One attack the audit runs on an update: its label in records, registry name, variant
    (``loss`` in records: the optimisation attack's variants are its losses)."""

    label: str
    attack: str
    loss: str | None = None

    def config(self, spec: AuditSpec, seed: int) -> Any:
        """Its settings for one attack seeded ``seed``."""
        return ATTACKS[self.attack].config(spec.table(self.attack), self.loss, seed)


def audit_runs(spec: AuditSpec) -> tuple[AttackRun, ...]:
    """Every attack run the audit's config asks for, in the order of ``spec.attacks``."""
    runs: list[AttackRun] = []
    for name in spec.attacks:
        variants = ATTACKS[name].variants(spec.table(name))
        runs += [AttackRun(f"{name}-{v}", name, v) for v in variants] or [AttackRun(name, name)]
    return tuple(runs)
