"""mlpapp: a ServerApp with FedAvg, audited by fl-sim (the lines marked fl-sim)."""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from fl_sim.audit.audited import AuditedStrategy  # fl-sim
from mlpapp.task import INPUT_SHAPE, MEAN, STD, Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run FedAvg for ``num-server-rounds``, every client update audited by SPEAR++."""
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())
    # fl-sim: the strategy wrapped, pointed at a run directory.
    strategy = AuditedStrategy(
        FedAvg(fraction_train=float(context.run_config["fraction-train"])),
        str(context.run_config["run-dir"]),
        model=global_model,
        input_shape=INPUT_SHAPE,
        mean=MEAN,
        std=STD,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": float(context.run_config["learning-rate"])}),
        num_rounds=int(context.run_config["num-server-rounds"]),
    )
    print(f"final global evaluation: {result.evaluate_metrics_clientapp}")
