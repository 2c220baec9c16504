"""How the audit runs each registered attack: on which updates, in which variants (the
optimisation attack once per loss), with which settings. One entry per name of
``attacks.ATTACKS``; the auditor looks attacks up here, never by name in code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attacks import AnalyticConfig, InversionConfig, SpearConfig
from fl_sim.config.schema import AttackTargets, AuditSpec


@dataclass(frozen=True)
class AttackRun:
    """One attack the audit runs on an update: its label in records, registry name, loss."""

    label: str
    attack: str
    loss: str | None = None


def attack_config(spec: AuditSpec, seed: int) -> SpearConfig:
    """The SPEAR++ settings an audit uses."""
    return SpearConfig(
        starts=spec.starts,
        steps=spec.steps,
        max_passes=spec.max_passes,
        time_budget_s=spec.time_budget_s,
        budget_clock=spec.budget_clock,
        seed=seed,
    )


def inversion_config(spec: AuditSpec, loss: str, seed: int) -> InversionConfig:
    """The optimisation attack's settings for one loss."""
    return spec.inversion.config(loss, seed)


@dataclass(frozen=True)
class AttackPlan:
    """How the audit runs one registered attack.

    Attributes
    ----------
    targets
        The attack's own rounds and clients within the audit's.
    losses
        Its variants, one run each (``()``: a single run labelled by the attack's name).
    settings
        ``settings(spec, run, seed)``: the attack's config for one run.
    """

    targets: Callable[[AuditSpec], AttackTargets]
    losses: Callable[[AuditSpec], tuple[str, ...]]
    settings: Callable[[AuditSpec, AttackRun, int], Any]


PLANS: dict[str, AttackPlan] = {
    "spearpp": AttackPlan(
        targets=lambda spec: spec.spearpp,
        losses=lambda spec: (),
        settings=lambda spec, run, seed: attack_config(spec, seed),
    ),
    "inversion": AttackPlan(
        targets=lambda spec: spec.inversion.targets,
        losses=lambda spec: spec.inversion.losses,
        settings=lambda spec, run, seed: inversion_config(spec, run.loss or "cosine", seed),
    ),
    # The audit's targets are its own: the rule is cheap enough to run wherever SPEAR++ may.
    "analytic": AttackPlan(
        targets=lambda spec: AttackTargets(),
        losses=lambda spec: (),
        settings=lambda spec, run, seed: AnalyticConfig(seed=seed),
    ),
}


def audit_runs(spec: AuditSpec) -> tuple[AttackRun, ...]:
    """Every attack run the audit's config asks for, in the order of ``spec.attacks``."""
    runs: list[AttackRun] = []
    for name in spec.attacks:
        losses = PLANS[name].losses(spec)
        runs += [AttackRun(f"{name}-{loss}", name, loss) for loss in losses] or [
            AttackRun(name, name)
        ]
    return tuple(runs)


def covers(spec: AuditSpec, run: AttackRun, server_round: int, client: int) -> bool:
    """Whether ``run`` attacks this client's update of this round."""
    return spec.targets.covers(server_round, client) and PLANS[run.attack].targets(spec).covers(
        server_round, client
    )
