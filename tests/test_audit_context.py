"""The audit's context, made one way per kind of run: a resumed audit runs with what the live
one ran with (a central-DP run's epsilon included), an app's audit from its audited.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from fl_sim import rundir
from fl_sim.audit.context import AuditContext
from fl_sim.config import parse_scenario
from fl_sim.config.schema import AuditSpec
from fl_sim.data.normalize import Normalization

RAW = {
    "data": {"source": "photos", "samples_per_client": 4, "test_size": 10},
    "model": {"width": 20, "depth": 2},
    "clients": {"count": 2, "batch_size": 4},
    "seed": 5,
    "federation": {"central_dp": {"noise_multiplier": 0.8}},
}


def test_a_resumed_audit_of_a_central_dp_run_reports_its_epsilon(tmp_path: Path) -> None:
    scenario = parse_scenario(RAW)
    live = AuditContext.for_scenario(scenario, tmp_path)
    rundir.write_scenario(tmp_path, scenario, RAW)
    resumed = AuditContext.stored(tmp_path).resumed({(1, 0, "spearpp")})
    assert live.round_epsilon is not None and resumed.round_epsilon is not None
    assert resumed.round_epsilon(3) == live.round_epsilon(3) > live.round_epsilon(1) > 0
    assert resumed.done == frozenset({(1, 0, "spearpp")}) and live.done == frozenset()
    assert (resumed.seed, resumed.layer, resumed.spec) == (5, live.layer, live.spec)
    plain = AuditContext.for_scenario(parse_scenario({**RAW, "federation": {}}), tmp_path)
    assert plain.round_epsilon is None


def test_an_apps_audit_is_resumed_from_its_audited_json(tmp_path: Path) -> None:
    spec = AuditSpec(grids=False)
    norm = Normalization((0.5,) * 3, (0.2,) * 3)
    live = AuditContext.for_app(spec, tmp_path, 7, None, ("0.weight", "0.bias"), (3, 8, 8), norm)
    resumed = AuditContext.stored(tmp_path)
    assert resumed == live and resumed.data is None


def test_a_run_that_says_nothing_of_its_audit_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"has neither scenario\.json nor audited\.json"):
        AuditContext.stored(tmp_path)
