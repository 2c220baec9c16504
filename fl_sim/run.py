"""Running a scenario in Flower's simulation engine, into a fresh run directory."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fl_sim.apps.client import make_client_app
from fl_sim.apps.server import make_server_app
from fl_sim.config.schema import Scenario
from fl_sim.data.federated import federated_data
from fl_sim.report import build_report
from fl_sim.report.plots import plot_accuracy

log = logging.getLogger(__name__)


def new_run_dir(out: Path | None, name: str, root: Path = Path("runs")) -> Path:
    """A directory no earlier run wrote to: ``out`` if given (must not hold files), else
    ``runs/NAME-YYYYmmdd-HHMMSS[-k]``."""
    if out is not None:
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(f"--out {out} already holds files: runs never overwrite")
        out.mkdir(parents=True, exist_ok=True)
        return out
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(1000):
        path = root / (f"{name}-{stamp}" + (f"-{k}" if k else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory under {root}")


def _quiet_ray() -> dict[str, Any]:
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    return {"logging_level": "ERROR", "log_to_driver": False, "include_dashboard": False}


def run_scenario(scenario: Scenario, resolved: dict[str, Any], out: Path | None = None) -> Path:
    """Run ``scenario`` with Flower's Ray-backed simulation; returns the run directory.

    The directory holds ``scenario.json`` (the resolved config), ``data.json`` (which dataset
    was actually used and its normalisation), ``rounds.jsonl``, ``clients.jsonl``,
    ``audit.jsonl``, ``grids/``, ``plots/``, ``run.log``, ``accuracy.png`` and ``report.html``.
    """
    from flwr.simulation import run_simulation

    run_dir = new_run_dir(out, scenario.name)
    (run_dir / "scenario.json").write_text(
        json.dumps({"resolved": resolved, "typed": asdict(scenario)}, indent=2)
    )
    handler = logging.FileHandler(run_dir / "run.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
        (run_dir / "data.json").write_text(
            json.dumps(
                {
                    "source": data.source,
                    "pool_size": len(data.labels),
                    "test_size": len(data.test),
                    "normalization": asdict(data.normalization),
                },
                indent=2,
            )
        )
        log.info(
            "run %s: %d clients, %d rounds, data %s, Ray %s",
            run_dir,
            len(scenario.clients),
            scenario.rounds,
            data.source,
            scenario.cluster.ray_address(),
        )
        run_simulation(
            server_app=make_server_app(scenario, run_dir),
            client_app=make_client_app(scenario),
            num_supernodes=len(scenario.clients),
            backend_config={
                "client_resources": {
                    "num_cpus": scenario.client_cpus,
                    "num_gpus": scenario.client_gpus,
                },
                "init_args": {**_quiet_ray(), "address": scenario.cluster.ray_address()},
            },
        )
        plot_accuracy(run_dir)
        build_report(run_dir)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    return run_dir
