"""The ServerApp: FedAvg over every client, each round, with the global model tested centrally."""

from __future__ import annotations

from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fl_sim.apps.recorder import RunRecorder
from fl_sim.config.schema import Scenario
from fl_sim.model import fc_relu_net


def initial_arrays(scenario: Scenario) -> ArrayRecord:
    """The global model at round 0, seeded by the scenario."""
    torch.manual_seed(scenario.seed)
    return ArrayRecord(fc_relu_net(scenario.model.width, scenario.model.depth).state_dict())


def build_strategy(scenario: Scenario, recorder: RunRecorder) -> FedAvg:
    """FedAvg that trains every client each round and evaluates only centrally."""
    n = len(scenario.clients)
    return FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=n,
        min_available_nodes=n,
        train_metrics_aggr_fn=recorder.client_metrics,
    )


def run_federation(grid: Grid, scenario: Scenario, run_dir: Path) -> None:
    """All rounds of ``scenario`` on ``grid``, recorded in ``run_dir``."""
    recorder = RunRecorder(scenario, run_dir)
    strategy = build_strategy(scenario, recorder)
    strategy.start(
        grid=grid,
        initial_arrays=initial_arrays(scenario),
        num_rounds=scenario.rounds,
        evaluate_fn=recorder.evaluate,
    )


def make_server_app(scenario: Scenario, run_dir: Path) -> ServerApp:
    """A ServerApp that runs ``scenario`` and records into ``run_dir``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_federation(grid, scenario, run_dir)

    return app
