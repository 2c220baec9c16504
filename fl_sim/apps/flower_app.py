"""Module-level apps for ``flwr run .`` (see ``[tool.flwr.app]`` in pyproject.toml), in
Flower's simulation runtime or its deployment runtime (a SuperLink and one SuperNode per client,
each told its client id by ``--node-config "partition-id=I num-partitions=N"``).

Under ``flwr run`` the scenario comes from the run config: ``scenario`` is the path of a TOML
file (relative to the app's directory, which ``flwr run`` ships to every SuperNode) and ``out``
the folder under which the run directory is made (relative to the SuperLink's working
directory). ``fl-sim run`` builds the same apps around an in-memory scenario instead. Either
way the run directory is the same (:mod:`fl_sim.rundir`): resumable by ``fl-sim audit`` and
reportable by ``fl-sim report``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fl_sim.apps.client import DefenceMods, client_reply
from fl_sim.apps.server import run_federation
from fl_sim.config import Scenario, load_scenario
from fl_sim.progress import RunProgress
from fl_sim.run import write_scenario
from fl_sim.rundir import new_run_dir

# The app's root: the project here, the unpacked app bundle under a SuperLink or SuperNode.
APP_DIR = Path(__file__).resolve().parents[2]


def _resolved(context: Context) -> tuple[Scenario, dict[str, Any]]:
    path = APP_DIR / str(context.run_config.get("scenario", "configs/quickstart.toml"))
    return load_scenario(path)


def _scenario(context: Context) -> Scenario:
    return _resolved(context)[0]


def partition_id(context: Context, scenario: Scenario) -> int:
    """This SuperNode's client id, from its ``--node-config`` (``partition-id``,
    ``num-partitions``), checked against the scenario's clients.

    Raises
    ------
    ValueError
        When the node's partitioning does not match the scenario's clients.
    """
    count = len(scenario.clients)
    pid = int(context.node_config["partition-id"])
    parts = int(context.node_config.get("num-partitions", count))
    if parts != count or not 0 <= pid < count:
        raise ValueError(
            f"node config partition-id={pid} num-partitions={parts}, but scenario "
            f"{scenario.name!r} has {count} clients: start one SuperNode per client with "
            f"--node-config 'partition-id=I num-partitions={count}' (I = 0..{count - 1})"
        )
    return pid


client = ClientApp()
server = ServerApp()


def _client_spec(context: Context) -> tuple[Scenario, int]:
    scenario = _scenario(context)
    return scenario, partition_id(context, scenario)


@client.train(mods=[DefenceMods(_client_spec)])
def train(msg: Message, context: Context) -> Message:
    """One client's round, its scenario read from the run config."""
    scenario = _scenario(context)
    client_id = partition_id(context, scenario)
    return Message(client_reply(scenario, msg.content, client_id, context.state), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    """All rounds of the run config's scenario, recorded in a fresh run directory."""
    scenario, resolved = _resolved(context)
    if scenario.federation.secagg is not None or scenario.federation.central_dp is not None:
        # Their client mods are fixed when a ClientApp is built; these module-level apps are
        # built before the run config names the scenario.
        raise ValueError(
            f"scenario {scenario.name!r}: [federation] defences (SecAgg+, central DP) run in "
            "fl-sim's simulation only (`fl-sim run`), not under `flwr run`"
        )
    out = Path(str(context.run_config.get("out", "runs")))
    run_dir = new_run_dir(None, scenario.name, root=out)
    write_scenario(run_dir, scenario, resolved)
    # Plain lines: Flower streams this process's output (flwr run --stream, flwr log).
    progress = RunProgress(scenario.rounds, run_dir, live=False)
    with progress:
        run_federation(grid, context, scenario, run_dir, progress=progress)
