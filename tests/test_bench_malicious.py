"""``fl-sim bench malicious``: one scenario under each server behaviour, the honest one first,
compared; the results folder keeps the runs' records, not their models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fl_sim.bench.malicious import (
    RECORDS,
    behaviours_run,
    keep_records,
    overrides_of,
    run_command,
)
from fl_sim.cli import main
from fl_sim.rundir import AUDIT, MODEL, REPORT

ROOT = Path(__file__).resolve().parents[1]


def test_the_honest_server_runs_first_and_once() -> None:
    assert behaviours_run(["trap"]) == ["honest", "trap"]
    assert behaviours_run(["sparsify", "honest", "trap"]) == ["honest", "sparsify", "trap"]
    with pytest.raises(ValueError, match="at least one besides honest"):
        behaviours_run(["honest"])
    with pytest.raises(ValueError, match="trap,trap: a behaviour named twice"):
        behaviours_run(["trap", "trap"])


def test_each_run_is_the_scenario_with_only_the_behaviour_changed(tmp_path: Path) -> None:
    sets = overrides_of("trap", ["rounds=1"], "cifar.npz")
    assert sets == [
        "rounds=1",
        "data.source=cifar10",
        "data.cifar10_dir=cifar.npz",
        "server.behaviour=trap",
    ]
    assert overrides_of("honest", [], None) == ["server.behaviour=honest"]
    command = run_command(Path("s.toml"), sets[:1], tmp_path / "runs" / "trap")
    assert command == [
        sys.executable, "-m", "fl_sim.cli", "-q", "run", "s.toml", "--set", "rounds=1",
        "--out", str(tmp_path / "runs" / "trap"),
    ]  # fmt: skip


def test_a_run_directory_keeps_its_records_only(tmp_path: Path) -> None:
    for name in [*RECORDS, MODEL, REPORT]:
        (tmp_path / name).write_text("x")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "a.png").write_text("x")
    keep_records(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == RECORDS


def test_a_bad_setting_is_refused_before_any_run(tmp_path: Path) -> None:
    argv = ["bench", "malicious", "--config", str(ROOT / "configs" / "malicious.toml")]
    with pytest.raises(SystemExit, match=r"fl-sim bench malicious: .*rounds"):
        main([*argv, "--set", "rounds=0", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="fl-sim bench malicious: --behaviours: name at least"):
        main([*argv, "--behaviours", "honest", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_trap_against_honest_on_a_small_federation(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [
        "bench", "malicious", "--config", str(ROOT / "configs" / "malicious.toml"),
        "--behaviours", "trap", "--out", str(out),
        "--set", "rounds=1", "--set", "clients.count=1", "--set", "model.width=100",
        "--set", "data.samples_per_client=8", "--set", "clients.batch_size=8",
        "--set", "server.trap.batch_size=8", "--set", "data.test_size=50",
        "--set", "audit.spearpp.time_budget_s=10",
    ]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((out / "compare.json").read_text())
    assert [r["behaviour"] for r in rows] == ["honest", "trap"]
    assert [r["samples"] for r in rows] == [8, 8]
    assert rows[0]["accuracy_cost"] == 0.0
    assert rows[1]["replies_flagged"] == rows[1]["replies_checked"] == 1
    assert json.loads((out / "malicious.json").read_text())["exits"] == {"honest": 0, "trap": 0}
    for behaviour in ("honest", "trap"):
        run = out / "runs" / behaviour
        assert {p.name for p in run.iterdir()} == RECORDS
        assert (run / AUDIT).read_text().count("\n") >= 1
