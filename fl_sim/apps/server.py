"""The ServerApp: FedAvg over every client, each round, with the global model tested centrally."""

from __future__ import annotations

from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from fl_sim.apps.recorder import RunRecorder
from fl_sim.audit.auditor import Auditor
from fl_sim.config.schema import Scenario
from fl_sim.model import array_keys, first_linear
from strategies import HonestButCurious

MODEL_FILE = "global_model.pt"


def initial_arrays(scenario: Scenario) -> ArrayRecord:
    """The global model at round 0, seeded by the scenario."""
    torch.manual_seed(scenario.seed)
    return ArrayRecord(scenario.model.build().state_dict())


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


def attacked_layer(scenario: Scenario) -> tuple[str, str]:
    """ArrayRecord keys of the first linear layer, the one SPEAR++ attacks (and the one whose
    rank tells the optimisation attack the batch size)."""
    name, _ = first_linear(scenario.model.build())
    return array_keys(name)


def run_federation(grid: Grid, scenario: Scenario, run_dir: Path) -> None:
    """All rounds of ``scenario`` on ``grid``, recorded in ``run_dir``; with the audit on, the
    server is honest but curious and every attack is collected before this returns."""
    recorder = RunRecorder(scenario, run_dir)
    strategy: Strategy = build_strategy(scenario, recorder)
    auditor = None
    if scenario.audit.enabled:
        layer = attacked_layer(scenario)
        auditor = Auditor(
            scenario.audit,
            recorder.data,
            run_dir,
            scenario.seed,
            architecture=scenario.model.build(),
            layer=layer,
            cluster=scenario.cluster,
        )
        strategy = HonestButCurious(strategy, auditor, layer, keep_whole=auditor.keeps_whole)
    try:
        result = strategy.start(
            grid=grid,
            initial_arrays=initial_arrays(scenario),
            num_rounds=scenario.rounds,
            evaluate_fn=recorder.evaluate,
        )
        torch.save(result.arrays.to_torch_state_dict(), run_dir / MODEL_FILE)
    finally:
        if auditor is not None:
            auditor.finish()


def make_server_app(scenario: Scenario, run_dir: Path) -> ServerApp:
    """A ServerApp that runs ``scenario`` and records into ``run_dir``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_federation(grid, scenario, run_dir)

    return app
