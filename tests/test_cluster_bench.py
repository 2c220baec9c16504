"""The scale and throughput benchmarks' machinery: process trees, memory, the measured rows."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from attacks import SpearConfig
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.memory import run_memory
from fl_sim.bench.scale import measure_command, run_facts
from fl_sim.bench.throughput import ThroughputPlan, run_throughput
from fl_sim.config import ClusterSpec
from fl_sim.proctree import descendants, stop_trees, tree_memory
from tests.helpers import real_images

# A parent that ignores SIGTERM, with a child: stopping it takes SIGKILL.
_STUBBORN = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
)


def test_tree_is_found_measured_and_stopped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _STUBBORN])
    try:
        deadline = time.monotonic() + 20
        while len(descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        tree = descendants(proc.pid)
        assert len(tree) == 2 and tree[0] == proc.pid
        memory = tree_memory(proc.pid)
        assert memory.processes == 2 and 0 < memory.pss <= memory.rss
    finally:
        killed = stop_trees([proc.pid], grace_s=1.0)
        proc.wait(timeout=10)
    assert proc.pid in killed  # it ignored SIGTERM
    assert not descendants(tree[1])  # its child went with the first SIGTERM to the tree


def test_peak_memory_of_a_command(tmp_path: Path) -> None:
    grow = "import time; x = bytearray(300 * 2**20); time.sleep(2)"
    row = measure_command([sys.executable, "-c", grow], tmp_path / "log", timeout_s=60)
    assert row["returncode"] == 0 and row["wall_seconds"] >= 2
    assert row["peak_rss_bytes"] >= 300 * 2**20 and row["peak_processes"] == 1
    late = measure_command([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "l", 1)
    assert late["returncode"] != 0 and late["wall_seconds"] < 20  # stopped at the timeout


def test_run_facts_read_the_run_directory(tmp_path: Path) -> None:
    rounds = [{"round": r, "seconds": s} for r, s in enumerate((1.0, 31.0, 35.0, 41.0))]
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    audit = [{"status": "exact", "seconds": 1.0}, {"status": "timeout", "seconds": None}]
    (tmp_path / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in audit))
    facts = run_facts(tmp_path)
    assert facts["rounds_done"] == 3 and facts["first_round_seconds"] == 30.0
    assert facts["later_round_seconds_mean"] == 5.0 and facts["last_round_at_seconds"] == 41.0
    assert facts["audit_statuses"] == {"exact": 1, "timeout": 1}
    assert facts["attack_seconds_mean"] == 1.0


def test_throughput_rows(tmp_path: Path) -> None:
    case = AttackCase("tiny", 4, 40, 3, attack=SpearConfig(starts=200, steps=200, max_passes=2))
    plan = ThroughputPlan(case, 2, ("pool",), (1,), ClusterSpec())
    (row,) = run_throughput(plan, real_images(), tmp_path, "test")
    assert row["statuses"] == {"exact": 2} and not row["errors"]
    assert row["per_minute"] == 60.0 * 2 / row["seconds"]
    assert "| pool | 1 |" in (tmp_path / "summary.md").read_text()
    assert not (tmp_path / "jobs").exists()  # job inputs are removed


def test_memory_rows_set_each_estimate_beside_the_measured_peak(tmp_path: Path) -> None:
    (row,) = run_memory([(8, 60, "float64")], real_images(), tmp_path, "test", seed=0)
    assert row["status"] == "exact"
    # A worker that imported torch and attacked: its measured peak, and the estimates as the
    # budget counts them, the unknown batch size's (bounded by min(m, n)) the larger.
    assert 0.2 < row["peak_gb"] < 3.0
    assert row["estimate_unknown_gb"] >= row["estimate_declared_gb"] > 0.5
    assert "| 8 | 60 | float64 |" in (tmp_path / "summary.md").read_text()
    assert not list(tmp_path.glob("*.npz"))  # job inputs are removed
