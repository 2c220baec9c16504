"""``fl-sim compare``: the figures of runs under each server behaviour against the honest run's,
counted by hand on small run directories, and the refusals of runs of different scenarios."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fl_sim.cli import main
from fl_sim.report.compare import compare_runs, first_difference

SCENARIO: dict[str, Any] = {
    "name": "malicious",
    "rounds": 2,
    "seed": 0,
    "model": {"width": 100, "depth": 3},
    "clients": [{"batch_size": 4}, {"batch_size": 4}],
}


def _run(
    path: Path,
    behaviour: str,
    records: list[dict[str, Any]],
    accuracy: float,
    flagged: list[bool | None],
    checks: str = "",
    **changes: Any,
) -> Path:
    path.mkdir()
    typed = {**SCENARIO, "server": {"behaviour": {"behaviour": behaviour}}, **changes}
    (path / "scenario.json").write_text(json.dumps({"resolved": {}, "typed": typed}))
    lines = (json.dumps(r) for r in records)
    (path / "audit.jsonl").write_text("".join(line + "\n" for line in lines))
    rounds = [{"round": 0, "test_accuracy": 0.1}, {"round": 2, "test_accuracy": accuracy}]
    (path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    clients = [
        {"round": 1, "client": i} | ({} if f is None else {"tamper_flagged": f} | (
            {"tamper_checks": checks} if f else {}))
        for i, f in enumerate(flagged)
    ]  # fmt: skip
    (path / "clients.jsonl").write_text("".join(json.dumps(c) + "\n" for c in clients))
    return path


def _record(client: int, attack: str, exact: float, near: float, **extra: Any) -> dict[str, Any]:
    return {
        "round": 1, "client": client, "attack": attack, "batch_size": 4,
        "share_exact": exact, "share_near_exact": near, **extra,
    }  # fmt: skip


def test_each_run_is_counted_by_its_best_attack_per_record_against_the_honest_run(
    tmp_path: Path,
) -> None:
    honest = _run(
        tmp_path / "honest",
        "honest",
        [_record(0, "spearpp", 0.5, 0.75), _record(1, "spearpp", 0.0, 0.25)],
        0.40,
        [False, False],
    )
    trap = _run(
        tmp_path / "trap",
        "trap",
        [
            _record(0, "spearpp", 0.25, 0.25),
            _record(0, "analytic", 0.75, 0.75),  # the better attack on client 0's update
            _record(1, "spearpp", None, None, status="failed"),
            _record(1, "analytic", 0.25, 0.5),
            # The cohort's record under SecAgg+ is not a client's: never counted.
            {**_record(-1, "spearpp", 1.0, 1.0), "view": "cohort", "batch_size": 8},
        ],
        0.30,
        [True, True],
        checks="active-share, rare-neurons",
    )
    first, second = compare_runs(honest, [trap])
    assert first.behaviour == "honest" and first.accuracy_cost == 0.0
    assert (first.samples, first.share_exact, first.share_near_exact) == (8, 0.25, 0.5)
    assert (first.most_exposed_client, first.most_exposed_share) == (0, 0.5)
    assert first.replies_flagged == 0 and first.replies_checked == 2
    assert second.behaviour == "trap" and second.samples == 8
    assert second.share_exact == pytest.approx((3 + 1) / 8)
    assert second.share_near_exact == pytest.approx((3 + 2) / 8)
    assert (second.most_exposed_client, second.most_exposed_share) == (0, 0.75)
    assert first.most_exposed_by_round == {1: 0.5} and second.most_exposed_by_round == {1: 0.75}
    assert second.by_attack == {"analytic": 0.5, "spearpp": 0.125}
    assert second.accuracy_cost == pytest.approx(0.10)
    assert second.flagged_share == 1.0
    assert second.checks_fired == {"active-share": 2, "rare-neurons": 2}


def test_runs_of_other_scenarios_and_a_dishonest_first_run_are_refused(tmp_path: Path) -> None:
    honest = _run(tmp_path / "honest", "honest", [], 0.4, [False])
    wider = _run(tmp_path / "wider", "trap", [], 0.3, [True], model={"width": 200, "depth": 3})
    with pytest.raises(ValueError, match=r"apart from \[server\]: model\.width: 100 against 200"):
        compare_runs(honest, [wider])
    with pytest.raises(ValueError, match=r"server\.behaviour = 'trap', expected 'honest' first"):
        compare_runs(wider, [honest])
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == "a.1.b: 2 against 3"
    assert first_difference({"a": 1}, {"b": 1}) == "a: 1 against '(absent)'"
    assert first_difference({"a": [1]}, {"a": [1]}) is None


def test_the_command_writes_the_table_the_json_and_the_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    honest = _run(tmp_path / "honest", "honest", [_record(0, "spearpp", 0.0, 0.0)], 0.4, [False])
    isolate = _run(
        tmp_path / "isolate", "isolate", [_record(0, "spearpp", 1.0, 1.0)], 0.35, [True],
        checks="dead-layer",
    )  # fmt: skip
    out = tmp_path / "cmp"
    assert main(["compare", str(honest), str(isolate), "--out", str(out)]) == 0
    rows = json.loads((out / "compare.json").read_text())
    assert [r["behaviour"] for r in rows] == ["honest", "isolate"]
    assert rows[1]["share_exact"] == 1.0 and rows[1]["checks_fired"] == {"dead-layer": 1}
    text = (out / "compare.txt").read_text()
    assert text.splitlines()[2].split()[:4] == ["honest", "4", "0%", "0%"]
    assert "dead-layer 1" in text and text.strip() in capsys.readouterr().out
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit, match=r"fl-sim compare: .*expected 'honest' first"):
        main(["compare", str(isolate), str(honest)])
