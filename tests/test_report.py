"""The report: summary table, and the HTML opened in headless Chromium with every image loaded."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fl_sim.audit.grid import save_grid
from fl_sim.report import build_report, summary_table
from fl_sim.report.faults import left_out_table
from fl_sim.report.plots import plot_accuracy


def _run_dir(root: Path) -> Path:
    rng = np.random.default_rng(0)
    root.mkdir()
    rounds = [
        {"round": r, "test_loss": 2.3 - 0.1 * r, "test_accuracy": 0.1 + 0.05 * r} for r in range(3)
    ]
    (root / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    (root / "data.json").write_text(json.dumps({"source": "photos:scikit-image"}))
    plot_accuracy(root)
    records = []
    for r in (1, 2):
        for c, (defence, eps, psnr) in enumerate([("fedsgd", None, 150.0), ("dp", 3.2 * r, 12.0)]):
            truth = rng.random((4, 3, 32, 32))
            rec = truth if psnr > 100 else rng.random((4, 3, 32, 32))
            grid = f"grids/r{r:03d}-c{c:03d}.png"
            save_grid(truth, rec, root / grid)
            records.append(
                {
                    "round": r,
                    "client": c,
                    "defence": defence,
                    "status": "exact" if psnr > 100 else "partial",
                    "batch_size": 4,
                    "batch_size_estimated": 4,
                    "psnr_mean": psnr,
                    "psnr_min": psnr,
                    "share_exact": float(psnr > 100),
                    "share_near_exact": float(psnr > 40),
                    "ssim_mean": 1.0,
                    "epsilon": eps,
                    "seconds": 1.0,
                    "grid": grid,
                }
            )
    records.append(
        {
            "round": 2,
            "client": 2,
            "defence": "fedavg",
            "status": "rejected",
            "reason": "reply lacks arrays",
            "batch_size": 4,
            "epsilon": None,
            "psnr_mean": None,
            "psnr_min": None,
            "share_exact": None,
            "share_near_exact": None,
            "ssim_mean": None,
            "seconds": None,
            "batch_size_estimated": None,
        }
    )
    (root / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root


def test_summary_table_per_client(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    records = [json.loads(x) for x in (run / "audit.jsonl").read_text().splitlines()]
    table = summary_table(records).splitlines()
    assert table[2].split()[:4] == ["0", "fedsgd", "-", "2"] and "100%" in table[2]
    assert table[3].split()[:3] == ["1", "dp", "6.4"]
    assert "rejected 1" in table[4]


def test_report_opens_offline_with_every_image(tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed")
    run = _run_dir(tmp_path / "run")
    report = build_report(run)
    html = report.read_text()
    assert 'src="http' not in html and "<script" not in html  # self-contained, offline
    expected = html.count("<img ")
    probe = run / "probe.html"
    probe.write_text(
        "<html><head><title>pending</title></head><body>"
        "<iframe id='f' src='report.html' onload=\"const d=document.getElementById('f')"
        ".contentDocument;const im=[...d.images];document.title=im.length+':'+"
        'im.filter(i=>i.complete&&i.naturalWidth>0).length"></iframe></body></html>'
    )
    out = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--allow-file-access-from-files",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            probe.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    title = re.search(r"<title>(.*?)</title>", out.stdout)
    assert title is not None, out.stderr[-2000:]
    total, loaded = (int(x) for x in title.group(1).split(":"))
    assert total == expected >= 4 + 4  # plots (3 + accuracy) and one grid per scored record
    assert loaded == total


def test_clients_left_out_are_listed_in_the_report(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run")
    rows = [
        {"round": r, "client": 3, "status": "diverged", "reason": f"nan {r}"} for r in (1, 2, 5)
    ]
    rows += [
        {"round": 1, "client": 0, "status": "ok"},
        {"round": 3, "client": None, "node_id": 77, "status": "client-error", "reason": "boom"},
    ]
    (run / "clients.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "scenario.json").write_text(json.dumps({"typed": {"rounds": 10}}))
    table = left_out_table(rows).splitlines()
    assert table[2].split() == ["3", "diverged", "1-2,", "5", "(3)", "nan", "5"]
    assert table[3].split() == ["node", "77", "client-error", "3", "(1)", "boom"]
    assert len(table) == 4 and left_out_table(rows[3:4]) == ""
    report = build_report(run).read_text()
    assert "Clients left out of aggregation" in report and "1-2, 5 (3)" in report
    assert "Rounds: 2 of 10 (the run stopped early)" in report


def _quickstart_like(root: Path) -> Path:
    """A run directory with every section of the report: the summary, a client left out, a
    secure aggregate, central DP's epsilon, the plots and the grids."""
    run = _run_dir(root)
    (run / "scenario.json").write_text(json.dumps({"typed": {"rounds": 2}}))
    rounds = [
        {"round": r, "test_loss": 2.0, "test_accuracy": 0.3, "epsilon": 1.5 * r} for r in (1, 2)
    ]
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    clients = [
        {"round": 1, "client": 0, "status": "ok", "tamper_flagged": False},
        {"round": 2, "client": 3, "status": "diverged", "reason": "training loss is nan"},
    ]
    (run / "clients.jsonl").write_text("".join(json.dumps(r) + "\n" for r in clients))
    cohort = {
        "round": 1,
        "client": -1,
        "view": "cohort",
        "defence": "secagg",
        "status": "failed",
        "clients": [0, 1],
        "batch_size": 8,
        "psnr_mean": 4.0,
        "share_exact": 0.0,
        "share_near_exact": 0.0,
        "dropped_nodes": [],
    }
    with (run / "audit.jsonl").open("a") as f:
        f.write(json.dumps(cohort) + "\n")
    return run


def test_the_report_has_every_section(tmp_path: Path) -> None:
    html = build_report(_quickstart_like(tmp_path / "run")).read_text()
    sections = re.findall(r"<h2>(.*?)</h2>", html)
    assert sections == [
        "Summary per client",
        "Secure aggregation: the sum the server saw",
        "Central DP: Flower's epsilon per round",
        "Clients left out of aggregation",
        "Leakage per round and client",
        "Leakage per defence",
        "Epsilon against leakage",
        "Global model",
        "Every reconstruction",
    ]
    assert "Rounds: 2. Server behaviour: honest;" in " ".join(html.split())
    assert "flagged the model it sent in 0 of 1 replies" in html
    assert "round   2: epsilon 3" in html and "training loss is nan" in html
    assert "over 1 rounds, 8 samples: 0% exact" in html  # the cohort table's last line
    # One row per record, with its grid where it has one: 4 scored, 1 rejected, 1 sum.
    assert html.count("<tr><td>") == 6 and html.count('alt="round ') == 4
    assert html.count("<img ") == 4 + 4 and "reply lacks arrays" in html


def test_what_the_records_say_is_escaped(tmp_path: Path) -> None:
    """Defence labels, statuses and reasons come from clients' replies: never markup."""
    run = _run_dir(tmp_path / "run")
    hostile = "<script>alert('x')</script>"
    rows = [json.loads(x) for x in (run / "audit.jsonl").read_text().splitlines()]
    rows[-1] |= {"defence": hostile, "reason": hostile}
    (run / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "clients.jsonl").write_text(
        json.dumps({"round": 2, "client": 5, "status": "rejected", "reason": hostile}) + "\n"
    )
    (run / "data.json").write_text(json.dumps({"source": hostile}))
    html = build_report(run).read_text()
    assert "<script" not in html
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
    # The data source, the summary's and the row's defence, the row's reason, the left-out table.
    assert html.count(escaped) == 5


def test_the_template_ships_in_the_wheel(tmp_path: Path) -> None:
    """pip install . gets the report's template (package data), not only the modules."""
    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "src"
    for name in ("fl_sim", "attacks", "clients", "strategies"):
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"),
            *("-w", str(tmp_path / "wheel"), str(src)),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert "fl_sim/report/templates/report.html.j2" in z.namelist()
