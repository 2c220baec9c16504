"""Module-level apps for ``flwr run .`` (see ``[tool.flwr.app]`` in pyproject.toml), in
Flower's simulation runtime or its deployment runtime (a SuperLink and one SuperNode per client,
each told its client id by ``--node-config "partition-id=I num-partitions=N"``).

Under ``flwr run`` the scenario comes from the run config: ``scenario`` is the path of a TOML
file (relative to the app's directory, which ``flwr run`` ships to every SuperNode) and ``out``
the folder under which the run directory is made (relative to the SuperLink's working
directory). ``fl-sim run`` (:mod:`fl_sim.apps.flwr_simulation`) names instead the run
directory it made, ``run-dir``, whose ``scenario.json`` holds the scenario as resolved (with
its ``--set`` overrides), and ``control-dir``, a folder of its own through which the ServerApp
tells it how many attacks it queued and its warnings (:class:`LauncherLink`), and it tells the
ServerApp to stop. Either way the run directory is the same (:mod:`fl_sim.rundir`):
resumable by ``fl-sim audit`` and reportable by ``fl-sim report``.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fl_sim.apps.checkpoint import ClientStore
from fl_sim.apps.client import DefenceMods, client_reply
from fl_sim.apps.flwr_simulation import (
    CONTROL_DIR_KEY,
    QUEUED_FILE,
    RUN_DIR_KEY,
    STOP_FILE,
    WARNINGS_FILE,
)
from fl_sim.apps.interruption import Interruption
from fl_sim.apps.server import run_federation
from fl_sim.config import Scenario, load_scenario, parse_scenario
from fl_sim.progress import RunProgress
from fl_sim.rundir import SCENARIO, new_run_dir, read_json, write_scenario

# The app's root: the project here, the unpacked app bundle under a SuperLink or SuperNode.
APP_DIR = Path(__file__).resolve().parents[2]

# How often the ServerApp looks for the launcher's stop request.
STOP_POLL_S = 0.2


def _run_dir(context: Context) -> Path | None:
    value = str(context.run_config.get(RUN_DIR_KEY, ""))
    return Path(value) if value else None


def _resolved(context: Context) -> tuple[Scenario, dict[str, Any]]:
    run_dir = _run_dir(context)
    if run_dir is not None:  # the launcher's run directory, its scenario already resolved
        resolved = read_json(run_dir / SCENARIO).get("resolved")
        if not isinstance(resolved, dict):
            raise ValueError(f"run-dir {run_dir}: no resolved scenario in {SCENARIO}")
        return parse_scenario(resolved), resolved
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
    run_dir = _run_dir(context)
    store = ClientStore(run_dir) if run_dir is not None else None
    reply = client_reply(scenario, msg.content, client_id, context.state, store)
    return Message(reply, reply_to=msg)


class LauncherLink(RunProgress):
    """The ServerApp's side of ``fl-sim run``'s launcher, through its control directory.

    Plain progress lines as :class:`~fl_sim.progress.RunProgress` prints them (they go to the
    run's log), and besides: each count of attacks queued appended to :data:`QUEUED_FILE`,
    the process's warnings to :data:`WARNINGS_FILE` (the launcher shows them on the user's
    terminal), and :attr:`interruption` requested once :data:`STOP_FILE` appears.

    Parameters
    ----------
    rounds
        The rounds the scenario asks for.
    run_dir
        The run directory.
    control_dir
        The launcher's control directory.
    """

    def __init__(self, rounds: int, run_dir: Path, control_dir: Path) -> None:
        super().__init__(rounds, run_dir, live=False)
        self.control_dir = control_dir
        self.interruption = Interruption()
        self._lines_lock = threading.Lock()
        self._handler = _JsonLinesHandler(control_dir / WARNINGS_FILE)
        self._stopped = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="stop-watcher", daemon=True)

    def __enter__(self) -> LauncherLink:
        super().__enter__()
        logging.getLogger().addHandler(self._handler)
        self._watcher.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stopped.set()
        logging.getLogger().removeHandler(self._handler)
        self._handler.close()
        super().__exit__(kind, error, trace)

    def attacks_queued(self, count: int) -> None:
        """Count them, and append ``count`` to :data:`QUEUED_FILE`."""
        super().attacks_queued(count)
        with self._lines_lock, (self.control_dir / QUEUED_FILE).open("a") as f:
            f.write(f"{count}\n")

    def _watch(self) -> None:
        while not self._stopped.wait(STOP_POLL_S):
            if (self.control_dir / STOP_FILE).exists():
                self.interruption.request()
                return


class _JsonLinesHandler(logging.Handler):
    """Warnings and errors as JSON lines (level, logger, message), flushed one by one."""

    def __init__(self, path: Path) -> None:
        super().__init__(logging.WARNING)
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        row = {"level": record.levelno, "logger": record.name, "message": record.getMessage()}
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        except (OSError, TypeError, ValueError):
            self.handleError(record)


@server.main()
def main(grid: Grid, context: Context) -> None:
    """All rounds of the run config's scenario, recorded in a fresh run directory (or in
    ``run-dir``, whose ``scenario.json`` holds it, when ``fl-sim run`` launched the run)."""
    scenario, resolved = _resolved(context)
    if scenario.federation.wide_defence:
        # Their client mods are fixed when a ClientApp is built; these module-level apps are
        # built before the run config names the scenario.
        raise ValueError(
            f"scenario {scenario.name!r}: [federation] defences (SecAgg+, central DP) run in "
            "fl-sim's simulation only (`fl-sim run`), not under `flwr run`"
        )
    run_dir = _run_dir(context)
    control = str(context.run_config.get(CONTROL_DIR_KEY, ""))
    if run_dir is None:
        out = Path(str(context.run_config.get("out", "runs")))
        run_dir = new_run_dir(None, scenario.name, root=out)
        write_scenario(run_dir, scenario, resolved)
    if control:
        link = LauncherLink(scenario.rounds, run_dir, Path(control))
        with link:
            run_federation(grid, context, scenario, run_dir, link.interruption, progress=link)
        return
    # Plain lines: Flower streams this process's output (flwr run --stream, flwr log).
    progress = RunProgress(scenario.rounds, run_dir, live=False)
    with progress:
        run_federation(grid, context, scenario, run_dir, progress=progress)
