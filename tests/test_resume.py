"""``fl-sim run --resume``: a federation killed with SIGKILL (its whole process group, as the
out-of-memory killer or a lost machine would) goes on after the last round its server
completed, and ends with the records of an uninterrupted run on the same seed: the global
model's accuracy per round, each client's status and epsilon per round, and one audit record
per (round, client, attack) with the same status, sample ids and certified count (the PSNR
itself may differ in its last digits: FedAvg sums the replies in the order they arrive)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fl_sim import cli
from fl_sim.rundir import AUDIT, CHECKPOINT, CLIENTS, ROUNDS, read_jsonl
from tests.processes import TWO_CLIENTS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

# Three clients, one of them under DP-SGD (its ledger must survive the kill), a small network
# whose updates SPEAR++ recovers well within its budget (the records then do not depend on the
# machine's load).
SCENARIO = """
name = "resumed"
rounds = 24
seed = 3
[data]
source = "photos"
samples_per_client = 48
test_size = 60
[model]
width = 200
depth = 3
[clients]
count = 3
lr = 0.1
batch_size = 16
[clients.1]
defence = "dp"
clip = 2.0
noise_multiplier = 0.5
[clients.2]
defence = "fedavg"
epochs = 2
mini_batch = 8
[audit]
knows_batch_size = false
[audit.spearpp]
time_budget_s = 60.0
"""


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fl_sim.cli", "-q", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: SIGKILL reaches all it started
        )


def _essence(run_dir: Path) -> dict[str, Any]:
    """What an interrupted and resumed run must have as an uninterrupted one has it."""
    audit = [
        (
            r["round"], r["client"], r.get("attack"), r["status"],
            tuple(s["id"] for s in r.get("samples") or ()), r.get("certified"),
        )
        for r in read_jsonl(run_dir / AUDIT)
    ]  # fmt: skip
    return {
        "rounds": [(r["round"], r["test_accuracy"]) for r in read_jsonl(run_dir / ROUNDS)],
        "clients": sorted(
            (r["round"], r["client"], r["status"], r.get("epsilon"))
            for r in read_jsonl(run_dir / CLIENTS)
        ),
        "audit": sorted(audit, key=repr),
    }


def _progress(run_dir: Path) -> tuple[int, int]:
    """Rounds the server tested (-1: none) and audit records on file."""
    rounds = max((r["round"] for r in read_jsonl(run_dir / ROUNDS)), default=-1)
    return rounds, len(read_jsonl(run_dir / AUDIT))


def _killed_and_resumed(config: Path, run_dir: Path, kills: int, seed: int) -> list[str]:
    """Run ``config`` into ``run_dir`` and SIGKILL its process group ``kills`` times, resuming
    after each; returns where each kill landed (rounds tested, records filed)."""
    rng = random.Random(seed)
    log = run_dir.with_suffix(".log")
    fresh = ["run", str(config), "--runtime", "legacy", "--out", str(run_dir)]
    proc = _start(fresh, log)
    landed: list[str] = []
    for _ in range(kills):
        done, records = _progress(run_dir)
        # Anywhere within a few seconds of the start (start-up, training, the audit), or once
        # one or two more rounds are tested (mid-training, between a round and its test), or
        # one or two more records filed (mid-audit, while records and grids are written).
        draw = rng.random()
        if draw < 0.3:
            time.sleep(rng.uniform(0.0, 4.0))
        else:
            which = 0 if draw < 0.6 else 1
            goal = (done, records)[which] + rng.randint(1, 2)
            while proc.poll() is None and _progress(run_dir)[which] < goal:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.2 if which == 0 else 0.5))
        if proc.poll() is not None:  # it finished first: nothing more to kill
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        done, records = _progress(run_dir)
        landed.append(f"rounds tested {done}, records {records}")
        resumable = (run_dir / CHECKPOINT).is_file()
        if not resumable:  # killed before round 0 was tested: the run starts again
            shutil.rmtree(run_dir, ignore_errors=True)
        proc = _start(["run", "--resume", str(run_dir)] if resumable else fresh, log)
    assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    return landed


@pytest.mark.slow
@pytest.mark.parametrize("kills", [3, 20])
def test_a_run_killed_again_and_again_ends_as_an_uninterrupted_one(
    tmp_path: Path, kills: int
) -> None:
    config = tmp_path / "resumed.toml"
    config.write_text(SCENARIO)
    reference = tmp_path / "reference"
    done = _start(["run", str(config), "--runtime", "legacy", "--out", str(reference)],
                  tmp_path / "reference.log")  # fmt: skip
    assert done.wait(timeout=900) == 0
    resumed = tmp_path / "resumed"
    landed = _killed_and_resumed(config, resumed, kills, seed=kills)
    print(f"{len(landed)} kills: {'; '.join(landed)}")
    expected, got = _essence(reference), _essence(resumed)
    assert got["rounds"] == expected["rounds"]
    assert got["clients"] == expected["clients"]
    assert got["audit"] == expected["audit"]
    keys = [(r["round"], r["client"], r.get("attack")) for r in read_jsonl(resumed / AUDIT)]
    assert len(keys) == len(set(keys))
    assert json.loads((resumed / "scenario.json").read_text())["runtime"] == "legacy"
    assert len(landed) == kills  # each landed before the run could finish


def test_resume_refuses_what_it_cannot_go_on_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(*args: str) -> str:
        with pytest.raises(SystemExit) as stopped:
            cli.main(["run", *args])
        assert stopped.value.code == 2
        return capsys.readouterr().err

    assert "not a run directory of fl-sim run" in refused("--resume", str(tmp_path / "nowhere"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "scenario.json").write_text(json.dumps({"resolved": {}}))
    assert "no round was completed (checkpoint.pt is missing)" in refused("--resume", str(run_dir))
    drop = refused("x.toml", "--resume", str(run_dir))
    assert "--resume takes the run's own scenario: drop config" in drop
    secagg = TWO_CLIENTS + "[federation.secagg]\n"
    (run_dir / "scenario.json").write_text(json.dumps({"resolved": _toml(secagg)}))
    assert "SecAgg+ and central DP run on Flower's legacy workflow" in refused(
        "--resume", str(run_dir)
    )
    assert "name a scenario file, or a run directory with --resume" in refused()


def _toml(text: str) -> dict[str, Any]:
    return tomllib.loads(text)
