"""The one place fl-sim calls Flower's deprecated ``run_simulation``: ``fl-sim run``'s
federation, in this process, on Ray, for the scenarios Flower's supported path cannot run.

``fl-sim run`` runs its federation on ``flwr run`` with the simulation runtime
(:mod:`fl_sim.apps.flwr_simulation`) unless the scenario has a federation-wide defence (SecAgg+,
central DP: their client mods are fixed when the ClientApp is built, and the module-level
ClientApp ``flwr run`` loads is built before any run config names the scenario), a Ray
cluster to join (Flower's federation config takes no Ray address; flwr run on a cluster is
not tried) or a fraction of a CPU per client; or when ``--runtime legacy`` asks for this one
(:func:`fl_sim.apps.runtime.choose_runtime`). docs/deployment.md ("fl-sim run on flwr run")
gives what was measured.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp
from flwr.simulation import run_simulation

from fl_sim.config.schema import Scenario


def _quiet_ray() -> dict[str, Any]:
    """Ray's ``init_args`` that keep its start-up and its workers' output off the terminal."""
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    return {"logging_level": "ERROR", "log_to_driver": False, "include_dashboard": False}


def simulate(server_app: ServerApp, client_app: ClientApp, scenario: Scenario) -> None:
    """Run the apps with one SuperNode per client of ``scenario``, on its Ray cluster with
    its resources per client; returns when the ServerApp does."""
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=len(scenario.clients),
        backend_config={
            "client_resources": {
                "num_cpus": scenario.client_cpus,
                "num_gpus": scenario.client_gpus,
            },
            "init_args": {**_quiet_ray(), "address": scenario.cluster.ray_address()},
        },
    )
