"""The report and the summary say which client replies the audit was to attack but holds no
record of (an audit cut short), and how it can be resumed; a whole audit says nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from fl_sim.report.coverage import (
    ClientCoverage,
    client_coverage,
    coverage_note,
    coverage_table,
    unaudited,
)
from fl_sim.report.terminal import print_summary
from fl_sim.rundir import (
    AUDIT,
    CHECKPOINT,
    CLIENTS,
    ROUNDS,
    SCENARIO,
    UPDATES_DIR,
    write_json,
    write_jsonl,
)


def _run(tmp_path: Path, audit: dict[str, object], recorded: list[tuple[int, int]]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_json(tmp_path / SCENARIO, {"typed": {"rounds": 3, "audit": audit}})
    replies = [{"round": r, "client": c, "status": "ok"} for r in (1, 2, 3) for c in (0, 1)]
    write_jsonl(tmp_path / CLIENTS, [*replies, {"round": 2, "client": None, "node_id": 7}])
    write_jsonl(tmp_path / AUDIT, [{"round": r, "client": c} for r, c in recorded])
    return tmp_path


def test_missing_replies_are_named_per_client(tmp_path: Path) -> None:
    run = _run(tmp_path, {"attacks": ["spearpp"], "spearpp": {}}, [(1, 0), (1, 1), (2, 0)])
    assert unaudited(run) == [(2, 1), (3, 0), (3, 1)]
    note = coverage_note(run)
    assert note.startswith("Not audited: 3 client replies the audit targets have no record")
    assert "client 0: rounds 3; client 1: rounds 2-3" in note
    assert "stored no updates to resume it from" in note
    (run / UPDATES_DIR).mkdir()
    (run / UPDATES_DIR / "r002-c001.npz").write_bytes(b"")
    assert f"`fl-sim audit {run}` resumes it" in coverage_note(run)


def test_only_the_audits_targets_count(tmp_path: Path) -> None:
    audit = {"rounds": [1, 2], "attacks": ["spearpp", "inversion"], "spearpp": {"clients": [0]},
             "inversion": {"rounds": [2]}}  # fmt: skip
    run = _run(tmp_path, audit, [(1, 0), (2, 0)])
    assert unaudited(run) == [(2, 1)]  # round 3 is not audited; (1, 1) is no attack's target


def test_a_whole_audit_or_none_says_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    every = [(r, c) for r in (1, 2, 3) for c in (0, 1)]
    run = _run(tmp_path / "whole", {"attacks": ["spearpp"]}, every)
    assert coverage_note(run) == ""
    off = _run(tmp_path / "off", {"enabled": False}, [])
    assert unaudited(off) == []
    cut = _run(tmp_path / "cut", {"attacks": ["spearpp"]}, [])
    print_summary(cut)
    assert "Not audited: 6 client replies" in capsys.readouterr().out


def test_each_client_says_what_was_audited_and_why_the_rest_was_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = {"rounds": [1, 2], "attacks": ["spearpp"]}
    run = _run(tmp_path, audit, [])
    finished = {"attack": "spearpp", "status": "partial", "defence": "fedsgd"}
    write_jsonl(
        run / AUDIT,
        [
            {"round": 1, "client": 0, **finished},
            {"round": 2, "client": 0, "attack": "spearpp", "status": "interrupted"},
            {"round": 1, "client": 1, "attack": "spearpp", "status": "timeout"},
            {"round": 1, "client": 1, "attack": "inversion", "status": "exact"},
            {"round": 2, "client": 1, "attack": None, "status": "client-error"},
            {"round": 2, "client": -1, "view": "cohort", "attack": "spearpp", "status": "exact"},
        ],
    )
    rows = client_coverage(run)
    assert rows == [
        ClientCoverage(0, 3, 1, {"interrupted": [2], "not scheduled": [3]}),
        ClientCoverage(1, 3, 1, {"client-error": [2], "not scheduled": [3]}),
    ]
    note = coverage_note(run)
    assert "no record" not in note and "attacks cut short (interrupted or timed out): 2" in note
    table = coverage_table(rows)
    assert "     0        3       1  interrupted: 2; not scheduled: 3" in table
    assert table.endswith("2 of 6 replies audited; 1 client-error, 1 interrupted, 2 not scheduled")
    write_jsonl(run / AUDIT, [{"round": 1, "client": 0, **finished}])
    assert client_coverage(run)[1].not_audited == {"no record": [1, 2], "not scheduled": [3]}
    print_summary(run)
    assert "What the audit does not hold" in capsys.readouterr().out


def test_a_whole_audit_has_no_coverage_table(tmp_path: Path) -> None:
    every = [(r, c) for r in (1, 2, 3) for c in (0, 1)]
    run = _run(tmp_path, {"attacks": ["spearpp"]}, every)
    write_jsonl(run / AUDIT, [{"round": r, "client": c, "attack": "spearpp", "status": "exact"}
                              for r, c in every])  # fmt: skip
    assert coverage_table(client_coverage(run)) == ""


def test_a_federation_stopped_early_is_resumed_with_fl_sim_run(tmp_path: Path) -> None:
    run = _run(tmp_path, {"attacks": ["spearpp"]}, [(1, 0)])
    write_jsonl(run / ROUNDS, [{"round": 0}, {"round": 1}])  # of 3 planned
    (run / CHECKPOINT).write_bytes(b"")
    assert f"`fl-sim run --resume {run}` goes on with the federation" in coverage_note(run)
    write_jsonl(run / ROUNDS, [{"round": r} for r in range(4)])  # trained to the end
    assert f"`fl-sim run --resume {run}`" not in coverage_note(run)
