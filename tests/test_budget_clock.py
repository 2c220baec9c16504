"""The time budget's clock: wall seconds, or the attack's own CPU seconds per torch thread,
which waiting (a busy machine, other attacks) does not use up."""

from __future__ import annotations

import time

import pytest
import torch

from attacks.spearpp.config import SpearConfig
from attacks.spearpp.rounds import budget_clock
from fl_sim.audit.runs import audit_runs
from fl_sim.config.schema import AuditSpec


def test_cpu_clock_does_not_count_waiting() -> None:
    wall, cpu = budget_clock("wall"), budget_clock("cpu")
    time.sleep(0.3)
    assert wall() >= 0.3
    assert cpu() < 0.1


def test_cpu_clock_counts_work() -> None:
    cpu = budget_clock("cpu")
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert cpu() >= 0.9 * 0.2 / torch.get_num_threads()


def test_unknown_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="budget_clock='gpu': allowed are wall, cpu"):
        SpearConfig(budget_clock="gpu")  # type: ignore[arg-type]


def test_audit_budget_counts_cpu_by_default() -> None:
    (default,) = audit_runs(AuditSpec())
    assert default.config(AuditSpec(), seed=0).budget_clock == "cpu"
    wall = AuditSpec(spearpp={"budget_clock": "wall"})
    assert default.config(wall, seed=0).budget_clock == "wall"
