"""Flower's deployment runtime on loopback: a SuperLink, two SuperNodes each with its partition
(``--node-config``), ``flwr run`` of this app for two rounds with the audit on; every process
stopped afterwards."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict

from fl_sim.apps.flower_app import partition_id
from fl_sim.apps.flwr_simulation import free_port
from fl_sim.config import parse_scenario
from tests.processes import TWO_CLIENTS, VENV_BIN, Processes

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = 'name = "deployed"\n' + TWO_CLIENTS


def _context(node_config: dict[str, Any]) -> Context:
    return Context(1, 1, node_config, RecordDict(), {})


def test_node_config_must_match_the_scenario() -> None:
    scenario = parse_scenario({"clients": {"count": 2}})
    assert partition_id(_context({"partition-id": 1, "num-partitions": 2}), scenario) == 1
    for wrong in ({"partition-id": 2, "num-partitions": 3}, {"partition-id": 2}):
        with pytest.raises(ValueError, match="num-partitions=2"):
            partition_id(_context(wrong), scenario)


@pytest.mark.slow
def test_superlink_and_two_supernodes_run_the_audited_federation(tmp_path: Path) -> None:
    link = free_port()
    flwr_home = tmp_path / "flwr"
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(
        f'[superlink.loopback]\naddress = "127.0.0.1:{link}"\ninsecure = true\n'
    )
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SCENARIO)
    env = {
        **os.environ,
        # The SuperLink and SuperNodes start flower-superexec and the apps from PATH.
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    }
    superlink = [
        *(str(VENV_BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1"),
        *("--port", str(link), "--disable-runtime-dependency-installation"),
    ]
    supernode = [
        *(str(VENV_BIN / "flower-supernode"), "--insecure", "--host", "127.0.0.1"),
        *("--superlink", f"127.0.0.1:{link}"),
    ]
    out = tmp_path / "runs"
    flwr_run = [
        *(str(VENV_BIN / "flwr"), "run", str(ROOT), "loopback", "--stream"),
        *("--run-config", f"scenario='{scenario}' out='{out}'"),
    ]
    procs = Processes(tmp_path)
    try:
        procs.start("superlink", superlink, env)
        procs.wait_log("superlink", "Application startup complete", 60)
        for pid in (0, 1):
            node = [
                "--port",
                str(free_port()),
                "--node-config",
                f"partition-id={pid} num-partitions=2",
            ]
            procs.start(f"supernode{pid}", [*supernode, *node], env)
        run = subprocess.run(flwr_run, env=env, capture_output=True, text=True, timeout=420)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        procs.stop()
    # flwr run exits 0 even when the run failed: the records are the evidence.
    (run_dir,) = out.iterdir()
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    records = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert sorted((r["round"], r["client"]) for r in records) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(r["status"] == "exact" and r["psnr_min"] >= 100 for r in records), records
