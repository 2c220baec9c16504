"""The one place fl-sim calls Flower's deprecated ``run_simulation``: ``fl-sim run``'s
federation, in this process, on Ray.

Flower's supported path, ``flwr run`` with the simulation runtime, runs the same apps
(:mod:`fl_sim.apps.flower_app`, ``flwr run .``), but as a FAB handed to a SuperLink whose
ServerApp runs in another process: the scenario with ``--set`` overrides, the live progress,
Ctrl-C with its summary and the federation-wide defences (whose client mods are fixed when
the ClientApp is built) do not cross that boundary today. The README ("Why fl-sim run uses
run_simulation") gives what was measured.
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
