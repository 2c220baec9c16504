"""``fl-sim bench certificates``: its grid covers what the certificate must hold on, and a run
judges every sample and writes its table as it goes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attacks.errors import NotLowRankError
from fl_sim.audit.metrics import JUDGED, judge_certificates
from fl_sim.bench import certificates
from fl_sim.bench.certificates import CertificateRow, grid
from fl_sim.cli import main


def test_grid_spans_classes_depths_precisions_defences_and_batch_sizes() -> None:
    rows = grid()
    one_hidden = [r for r in rows if r.depth == 2]
    assert {r.classes for r in one_hidden} == {2, 3, 10}
    assert {3, 6} <= {r.depth for r in rows}
    assert {r.dtype for r in rows} == {"float64", "float32"}
    assert {r.defence for r in rows} == {"fedsgd", "fedavg"}
    for c in (3, 10):
        sizes = {r.batch_size for r in one_hidden if r.classes == c}
        assert min(sizes) < c < max(sizes)
    assert len({r.name for r in rows}) == len(rows)


def test_row_refuses_unknown_settings() -> None:
    with pytest.raises(ValueError, match="dtype='float16'"):
        CertificateRow(20, 80, 2, 3, 4, "float16", "fedsgd")
    with pytest.raises(ValueError, match="defence='dp'"):
        CertificateRow(20, 80, 2, 3, 4, "float64", "dp")


def test_bench_judges_a_mixing_row_without_wrong_certificates(tmp_path: Path) -> None:
    out = tmp_path / "cert"
    code = main(
        [
            "-q",
            "bench",
            "certificates",
            "--seeds",
            "2",
            "--only",
            "C=3 B=2 float64 fedsgd",
            "--time-budget",
            "20",
            "--out",
            str(out),
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["rows"]
    assert row["attacks"] == 2 and row["samples"] == 4
    assert row["certified_not_exact"] == 0 and code == 0
    lines = (out / "attacks.jsonl").read_text().splitlines()
    assert [json.loads(line)["seed"] for line in lines] == [0, 1]
    table = (out / "summary.md").read_text()
    assert "| n=20 m=80 depth=2 C=3 B=2 float64 fedsgd | 2 | 4 |" in table


def test_bench_names_the_rows_when_none_matches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="--only 'C=7' matches none of n=20"):
        main(["bench", "certificates", "--only", "C=7"])


def test_bench_resumes_from_the_attacks_a_killed_run_wrote(tmp_path: Path) -> None:
    out = tmp_path / "cert"
    args = ["-q", "bench", "certificates", "--only", "depth=2 C=10 B=4 float64 fedsgd"]
    args += ["--time-budget", "20", "--out", str(out)]
    assert main([*args, "--seeds", "1"]) == 0
    (first,) = (out / "attacks.jsonl").read_text().splitlines()
    # A crash while writing leaves a line cut short: it is skipped, not glued to the next.
    with (out / "attacks.jsonl").open("a") as cut:
        cut.write('{"row": "n=20')
    assert main([*args, "--seeds", "2"]) == 0
    lines = (out / "attacks.jsonl").read_text().splitlines()
    assert lines[0] == first and lines[1] == '{"row": "n=20'
    assert [json.loads(line)["seed"] for line in lines[2:]] == [1]
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["attacks"] == 2 and row["samples"] == 8
    # Another budget is another measurement: nothing is taken over.
    assert main([*args[:-4], "--time-budget", "21", "--out", str(out), "--seeds", "1"]) == 0
    assert len((out / "attacks.jsonl").read_text().splitlines()) == 4


def test_a_refused_attack_is_recorded_and_the_grid_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise NotLowRankError(181, "float-rank", 181, 3072, 19)

    monkeypatch.setattr(certificates, "reconstruct", refuse)
    out = tmp_path / "cert"
    args = ["-q", "bench", "certificates", "--seeds", "2", "--only", "C=3 B=2 float64 fedsgd"]
    assert main([*args, "--out", str(out)]) == 0
    (row,) = json.loads((out / "summary.json").read_text())["rows"]
    assert row["statuses"] == {"refused": 2} and row["exact"] == row["certified"] == 0
    record = json.loads((out / "attacks.jsonl").read_text().splitlines()[0])
    assert "not low-rank" in record["reason"] and set(JUDGED) <= set(record)


def test_the_judged_keys_are_the_judges() -> None:
    pixels = torch.rand(3, 12, dtype=torch.float64)
    assert tuple(judge_certificates(pixels, pixels, torch.ones(3, dtype=torch.bool))) == JUDGED
