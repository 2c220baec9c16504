"""A run on an existing Ray cluster: a head and a worker node started here with ``ray start``,
the simulation joining it through ``RAY_ADDRESS``, the attacks as Ray tasks on the node that
alone offers the ``attack`` resource; every cluster process stopped by pid afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fl_sim.apps.flwr_simulation import free_port
from tests.processes import TWO_CLIENTS, VENV_BIN, Processes

SCENARIO = (
    'name = "on-cluster"\n'
    + TWO_CLIENTS
    + """workers = 2
wait_s = 120
[clients.1]
defence = "fedavg"
epochs = 2
mini_batch = 3
"""
)


def _ports() -> list[str]:
    """Every port a Ray node opens, free ones: other Ray instances may share this machine."""
    names = (
        "node-manager-port",
        "object-manager-port",
        "metrics-export-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
    )
    return [a for name in names for a in (f"--{name}", str(free_port()))]


@pytest.fixture
def ray_cluster(tmp_path: Path) -> Iterator[str]:
    """Head (1 CPU: Flower's client actors) and a worker node (no CPU, 2 ``attack`` units).

    Ray keeps the session under its own short ``--temp-dir`` (socket paths are limited to 107
    bytes), so no other process on the machine finds this cluster by auto-detection.
    """
    ray = str(VENV_BIN / "ray")
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = [
        *("--block", "--node-ip-address", "127.0.0.1", "--disable-usage-stats"),
        *("--object-store-memory", str(80 * 2**20)),
    ]
    head = [
        *(ray, "start", "--head", "--port", str(port), "--num-cpus", "1"),
        *("--include-dashboard", "false", "--dashboard-port", str(free_port())),
        *("--ray-client-server-port", str(free_port())),
    ]
    node = [ray, "start", "--address", address, "--num-cpus", "0"]
    procs = Processes(tmp_path)
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as temp_dir:
        try:
            procs.start("head", [*head, *common, *_ports(), "--temp-dir", temp_dir])
            procs.wait_log("head", "Ray runtime started", 60)
            procs.start("node", [*node, *common, *_ports(), "--resources", '{"attack": 2}'])
            procs.wait_log("node", "Ray runtime started", 60)
            yield address
        finally:
            procs.stop()


def test_simulation_and_attacks_on_a_ray_cluster(ray_cluster: str, tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster}
    done = subprocess.run(
        [
            *(str(VENV_BIN / "fl-sim"), "run", str(scenario), "--out", str(run_dir)),
            *("--set", "cluster.attack_executor=ray", "--set", "cluster.attack_resource=attack"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Ray {ray_cluster}" in (run_dir / "run.log").read_text()
    records = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    # Only the worker node offers "attack": a record that is not a timeout ran there.
    assert sorted((r["round"], r["client"]) for r in records) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    fedsgd = [r for r in records if r["client"] == 0]
    assert all(r["status"] == "exact" and r["psnr_min"] >= 100 for r in fedsgd), fedsgd
    assert all(r["status"] in ("exact", "partial") for r in records), records
