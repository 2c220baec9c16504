"""The results table: one folder of bench/results/ per row of bench/targets.toml, and
docs/results.md exactly what `fl-sim bench results` writes from them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fl_sim.bench.results import Target, load_targets, render, run_target, stale_folders
from fl_sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "bench" / "targets.toml"
RESULTS = ROOT / "bench" / "results"


def test_every_row_has_its_folder_and_every_folder_its_row() -> None:
    targets = load_targets(TARGETS)
    assert [t.name for t in targets if not (RESULTS / t.name).is_dir()] == []
    assert stale_folders(targets, RESULTS) == []


def test_the_committed_table_is_the_one_generated_from_the_folders() -> None:
    assert (ROOT / "docs" / "results.md").read_text() == render(load_targets(TARGETS), RESULTS)


def test_the_command_writes_the_table(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    argv = ["bench", "results", "--targets", str(TARGETS), "--results", str(RESULTS)]
    assert main([*argv, "--out", str(out)]) == 0
    assert out.read_text() == (ROOT / "docs" / "results.md").read_text()
    with pytest.raises(SystemExit, match="--run nope: no such row; rows: certificates, "):
        main([*argv, "--out", str(out), "--run", "nope"])


def test_a_re_run_replaces_the_folder_and_a_failed_one_keeps_it(tmp_path: Path) -> None:
    folder = tmp_path / "limits"
    folder.mkdir()
    (folder / "rows.jsonl").write_text('{"stale": true}\n')
    sweep = str(RESULTS / "sweep-m200")
    good = Target(
        name="limits", kind="limits", what="w", args=("bench", "limits", sweep), data=False
    )
    assert run_target(good, tmp_path, None) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["limit.png", "summary.md", "sweep.json"]
    bad = good.model_copy(update={"args": ("bench", "limits", str(tmp_path / "none"))})
    assert run_target(bad, tmp_path, None) != 0
    assert sorted(p.name for p in folder.iterdir()) == ["limit.png", "summary.md", "sweep.json"]


def test_a_re_run_records_the_folder_it_lands_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def bench(command: list[str], check: bool) -> subprocess.CompletedProcess[bytes]:
        out = Path(command[command.index("--out") + 1])
        out.mkdir()
        (out / "summary.md").write_text(f"command: `fl-sim {' '.join(command[3:])}`\n")
        (out / "limit.png").write_bytes(b"--out " + str(out).encode())
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", bench)
    row = Target(name="r", kind="limits", what="w", args=("bench", "limits", "x"), data=False)
    assert run_target(row, tmp_path, None) == 0
    assert (tmp_path / "r" / "summary.md").read_text() == (
        f"command: `fl-sim bench limits x --out {tmp_path / 'r'}`\n"
    )
    # Only the text records are rewritten, never an image.
    assert b".r.partial" in (tmp_path / "r" / "limit.png").read_bytes()


def test_bad_rows_are_refused_naming_the_key_and_what_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "targets.toml"
    path.write_text('[[row]]\nname = "a"\nkind = "table"\nwhat = "x"\n')
    with pytest.raises(ValueError, match=r"row\.0\.kind = 'table': allowed are attack, "):
        load_targets(path)
    path.write_text('[[row]]\nname = "a"\nkind = "folder"\nwhat = "x"\n' * 2)
    with pytest.raises(ValueError, match="row names used twice: a"):
        load_targets(path)
    path.write_text('[[row]]\nname = "a"\nkind = "folder"\nwhat = "x"\nseeds = 3\n')
    with pytest.raises(ValueError, match=r"unknown key 'row\.0\.seeds'"):
        load_targets(path)


def _row(case: str, seed: int, dtype: str, under_100: int, under_40: int) -> dict[str, Any]:
    return {
        "case": case, "seed": seed, "samples": 10, "share_exact": 0.5, "share_near_exact": 1.0,
        "seconds": 2.0, "dtype": dtype, "arrays": "tensors", "noise_std": 0.0,
        "certified_not_exact": under_100, "certified_not_near_exact": under_40,
        "attack": {"certified": 10},
    }  # fmt: skip


def test_a_certificate_is_wrong_under_100_db_in_float64_and_under_40_in_float32(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "results" / "row"
    folder.mkdir(parents=True)
    meta = {"meta": {"hardware": {"processor": "x86_64", "cpu_threads": 2, "torch": "2"}}}
    (folder / "summary.json").write_text(json.dumps(meta))
    rows = [_row("f64 B=10", 0, "float64", 3, 0), _row("f32 B=10", 0, "float32", 4, 1)]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    targets = tmp_path / "targets.toml"
    targets.write_text('[[row]]\nname = "row"\nkind = "attack"\nwhat = "w"\nargs = ["bench"]\n')
    text = render(load_targets(targets), tmp_path / "results")
    assert "| row | w | 50.0% | 100.0% | 100.0% | 4 |" in text  # 3 in float64 + 1 in float32
    assert "| f64 B=10 | 1 | 50.0% | 100.0% | 100.0% | 3 | 2.0 |" in text
    assert "| f32 B=10 | 1 | 50.0% | 100.0% | 100.0% | 1 | 2.0 |" in text


def test_a_secagg_row_counts_the_points_attacked_not_the_skipped_ones(tmp_path: Path) -> None:
    folder = tmp_path / "results" / "sum"
    folder.mkdir(parents=True)
    point = {"width": 1000, "cohort": 2, "batch_per_client": 4, "samples": 8}
    run = {
        "meta": {"hardware": {"processor": "x86_64", "cpu_threads": 1, "torch": "2"}},
        "plan": {
            "time_budget_s": 30.0,
            "secagg": {"max_weight": 64.0, "quantization_range": 2**26, "clipping_range": 8.0},
        },
        "rows": [
            {**point, "status": "exact", "share_exact": 0.5, "share_near_exact": 1.0,
             "seconds_attack": 1.25},
            {**point, "cohort": 64, "samples": 256, "status": "skipped"},
        ],
    }  # fmt: skip
    (folder / "secagg.json").write_text(json.dumps(run))
    targets = tmp_path / "targets.toml"
    targets.write_text('[[row]]\nname = "sum"\nkind = "secagg"\nwhat = "w"\nargs = ["bench"]\n')
    text = render(load_targets(targets), tmp_path / "results")
    assert "| sum | w | 50.0% | 100.0% | - | not counted |" in text
    assert "max_weight 64, 2^26 levels, clip +-8; 30 s per attack" in text
    assert "| 1000 | 2 | 4 | 8 | exact | 50.0% | 100.0% | 1.2 |" in text
    assert "| 1000 | 64 | 4 | 256 | skipped | - | - | - |" in text
