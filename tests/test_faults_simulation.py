"""End to end, in Flower's simulation engine: a federation that survives its clients (one that
diverges, one that crashes, one that sends garbage, or all of them failing), and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from clients.reply import ARRAYS
from fl_sim.apps.client import client_reply
from fl_sim.apps.server import initial_arrays
from fl_sim.config import Scenario, parse_scenario
from fl_sim.data.federated import federated_data
from fl_sim.run import run_scenario
from tests.processes import ctrl_c_reachable

ROOT = Path(__file__).resolve().parents[1]

SMALL: dict[str, Any] = {
    "rounds": 2,
    "data": {"source": "photos", "samples_per_client": 20, "test_size": 40},
    "model": {"width": 24, "depth": 3},
    "clients": {"count": 4, "batch_size": 6, "lr": 0.05, "1": {"lr": 1e4}},
    "audit": {"spearpp": {"starts": 100, "steps": 100, "max_passes": 1}},
}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _faulty_clients(scenario: Scenario, run_dir: Path | None = None) -> ClientApp:
    """The scenario's clients, but client 2 crashes in round 2 (Flower's error reply, no
    content) and client 3 returns a first layer of the wrong shape."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        client = int(context.node_config["partition-id"])
        if client == 2 and msg.content["config"]["server-round"] == 2:
            raise RuntimeError("client 2 crashed")
        reply = client_reply(scenario, msg.content, client, context.state)
        if client == 3:
            arrays = reply[ARRAYS]
            assert isinstance(arrays, ArrayRecord)
            garbage = {k: arrays[k] for k in arrays} | {"1.weight": Array(np.zeros((2, 2)))}
            reply[ARRAYS] = ArrayRecord(garbage)
        return Message(reply, reply_to=msg)

    return app


def test_diverging_crashing_and_garbage_clients_are_recorded_and_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Faulty clients built in this process: the legacy runtime's (flwr run builds its own).
    monkeypatch.setattr("fl_sim.run.make_client_app", _faulty_clients)
    run_dir = run_scenario(parse_scenario(SMALL), SMALL, tmp_path / "run", runtime="legacy")
    assert [r["round"] for r in _rows(run_dir / "rounds.jsonl")] == [0, 1, 2]
    clients = {(c["round"], c["client"]): c for c in _rows(run_dir / "clients.jsonl")}
    statuses = {key: c["status"] for key, c in clients.items()}
    assert statuses == {
        **{(r, 0): "ok" for r in (1, 2)},
        **{(r, 1): "diverged" for r in (1, 2)},
        (1, 2): "ok",
        (2, 2): "client-error",  # its error reply has no content: known from round 1
        **{(r, 3): "rejected" for r in (1, 2)},
    }
    assert "loss on its batch went from" in clients[(2, 1)]["reason"]
    assert "client 2 crashed" in clients[(2, 2)]["reason"]
    assert "1.weight has shape (2, 2)" in clients[(1, 3)]["reason"]
    audit = {(r["round"], r["client"]): r for r in _rows(run_dir / "audit.jsonl")}
    assert set(audit) == set(clients)
    for key, row in clients.items():
        if row["status"] == "ok":  # attacked: a SPEAR++ record
            assert audit[key]["attack"] == "spearpp" and audit[key]["psnr_mean"] is not None
        else:  # never attacked: the status and reason of the fault
            assert audit[key]["attack"] is None
            assert (audit[key]["status"], audit[key]["reason"]) == (row["status"], row["reason"])
    assert audit[(1, 1)]["batch_size"] == 6 and audit[(1, 1)]["defence"] == "fedsgd"
    model = torch.load(run_dir / "global_model.pt")
    assert all(bool(torch.isfinite(v).all()) for v in model.values())
    report = (run_dir / "report.html").read_text()
    assert "Clients left out of aggregation" in report
    assert all(s in report for s in ("diverged", "client-error", "rejected"))


def test_a_round_without_any_usable_reply_keeps_the_global_model(tmp_path: Path) -> None:
    raw: dict[str, Any] = {
        **SMALL,
        "clients": {"count": 2, "batch_size": 6, "lr": 1e4},
        "audit": {"enabled": False},
    }
    scenario = parse_scenario(raw)
    run_dir = run_scenario(scenario, raw, tmp_path / "run")
    assert {c["status"] for c in _rows(run_dir / "clients.jsonl")} == {"diverged"}
    rounds = _rows(run_dir / "rounds.jsonl")
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert len({r["test_loss"] for r in rounds}) == 1  # the model never changed
    described = federated_data(scenario.data, len(scenario.clients), scenario.seed).description
    start = initial_arrays(scenario, described).to_torch_state_dict()
    end = torch.load(run_dir / "global_model.pt")
    assert all(torch.equal(start[k], end[k]) for k in start)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_writes_the_summary_and_report_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C at a terminal: SIGINT to the command's whole process group (Ray's too), on the
    legacy runtime, whose Ray runs in that group (on flwr run:
    tests/test_flwr_simulation.py, slow)."""
    config = tmp_path / "long.toml"
    config.write_text(
        'rounds = 50\n[data]\nsource = "photos"\nsamples_per_client = 20\ntest_size = 40\n'
        "[model]\nwidth = 24\ndepth = 3\n[clients]\ncount = 2\nbatch_size = 6\n"
        "[audit.spearpp]\nstarts = 100\nsteps = 100\nmax_passes = 1\n"
    )
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "fl_sim.cli", "-q", "run", str(config), "--out", str(run_dir)]
    command += ["--runtime", "legacy"]
    with ctrl_c_reachable():
        proc = subprocess.Popen(
            command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    try:
        rounds = run_dir / "rounds.jsonl"
        deadline = time.monotonic() + 120
        while not (rounds.is_file() and len(rounds.read_text().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # once round 2 is recorded
        # The server gets STOP_GRACE_S (60 s) to file what is pending, then the report is built:
        # 90 s ran out once on a machine at load 5 to 20.
        out, err = proc.communicate(timeout=240)
        deadline = time.monotonic() + 20
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(proc.pid), "processes of the run outlived it"
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err.decode()[-3000:]
    message = err.decode().strip().splitlines()[-1]
    assert message.startswith("fl-sim run: interrupted (Ctrl-C) after round") and "of 50" in message
    assert "Leakage audit" in out.decode() and "report.html" in message
    assert "(the run stopped early)" in (run_dir / "report.html").read_text()
    done = max(r["round"] for r in _rows(run_dir / "rounds.jsonl"))
    assert 2 <= done < 50
    assert {r["round"] for r in _rows(run_dir / "clients.jsonl")} >= {1, 2}
    statuses = {r["status"] for r in _rows(run_dir / "audit.jsonl")}
    assert statuses <= {"exact", "partial", "failed", "refused", "interrupted"}
