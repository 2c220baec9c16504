"""Module-level apps for ``flwr run .`` (see ``[tool.flwr.app]`` in pyproject.toml).

Under ``flwr run`` the scenario comes from the run config: ``scenario`` is the path of a TOML
file (relative to the app's directory) and ``out`` the folder under which the run directory is
made. ``fl-sim run`` builds the same apps around an in-memory scenario instead.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fl_sim.apps.client import local_round
from fl_sim.apps.server import run_federation
from fl_sim.config import Scenario, load_scenario
from fl_sim.run import new_run_dir


def _scenario(context: Context) -> Scenario:
    path = Path(str(context.run_config.get("scenario", "configs/quickstart.toml")))
    scenario, _ = load_scenario(path)
    return scenario


client = ClientApp()
server = ServerApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    """One client's round, its scenario read from the run config."""
    client_id = int(context.node_config["partition-id"])
    return Message(
        local_round(_scenario(context), msg.content, client_id, context.state), reply_to=msg
    )


@server.main()
def main(grid: Grid, context: Context) -> None:
    """All rounds of the run config's scenario, recorded in a fresh run directory."""
    scenario = _scenario(context)
    out = Path(str(context.run_config.get("out", "runs")))
    run_federation(grid, scenario, new_run_dir(None, scenario.name, root=out))
