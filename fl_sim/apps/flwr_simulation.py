"""``fl-sim run``'s federation on Flower's supported path: ``flwr run`` with the simulation
runtime, behind a private local SuperLink that this module starts (through ``flwr run``) and
stops.

:class:`FlwrSimulation` makes a private ``FLWR_HOME`` (a temporary folder) whose
``config.toml`` has one ``:local:`` connection, a small app folder whose ``pyproject.toml``
names :mod:`fl_sim.apps.flower_app`'s ``server`` and ``client`` (so the installed fl-sim is
what runs, whatever the working directory), and a control folder. It picks free ports for the
SuperLink, runs ``flwr run APP fl-sim --stream`` with the run config ``run-dir`` (the run
directory, whose ``scenario.json`` already holds the resolved scenario) and ``control-dir``,
and the federation config ``num-supernodes`` and the clients' resources (``--federation-config``:
Flower 1.42 deprecates ``options.*`` in a connection). Flower's output goes
to the run's ``run.log``; the live progress is read off the run directory (``rounds.jsonl``,
``clients.jsonl``, ``audit.jsonl``) and the control folder (attacks queued, the ServerApp's
warnings, shown once each); see :class:`fl_sim.apps.flower_app.LauncherLink`.

``flwr run`` exits 0 even when the run failed: the run's status (``flwr ls``) and the global
model the ServerApp saves at its end say whether it succeeded. Ctrl-C asks the ServerApp to
stop (its stop file; ``flwr stop`` if it does not within :data:`STOP_GRACE_S`). The SuperLink
outlives ``flwr run``: it is found by its private ``FLWR_HOME`` in its command line and stopped
with every process it started, also those Ray left behind in its sessions, and nothing else.

Scenarios fl-sim does not run on this runtime stay on :mod:`fl_sim.apps.in_process`;
:func:`fl_sim.apps.runtime.choose_runtime` decides.
"""

from __future__ import annotations

import json
import logging
import os
import re
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import fl_sim
from fl_sim import rundir
from fl_sim.apps.superlink import RUN_FOLDER_PREFIX, stale_runs, start_watchdog, stop_superlink
from fl_sim.config.schema import Scenario
from fl_sim.progress import RunProgress

log = logging.getLogger(__name__)

# Run config keys the launcher sets for fl_sim.apps.flower_app (empty there: not launched).
RUN_DIR_KEY = "run-dir"
CONTROL_DIR_KEY = "control-dir"
# Files of the control folder: attacks queued (one count a line), the ServerApp's warnings
# (one JSON object a line: level, logger, message), and the launcher's request to stop.
QUEUED_FILE = "queued"
WARNINGS_FILE = "warnings.jsonl"
STOP_FILE = "stop"
# The connection fl-sim writes into its private FLWR_HOME.
CONNECTION = "fl-sim"
# After Ctrl-C, how long the ServerApp gets to file what is pending and end the run.
STOP_GRACE_S = 60.0
# How often the run directory is read for progress while the run goes.
POLL_S = 0.25
# How long flwr's own commands (ls, stop) may take.
COMMAND_TIMEOUT_S = 60.0
# Flower's colour codes, kept out of run.log.
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
_STARTED = re.compile(r"Successfully started run (\d+)")

_APP_PYPROJECT = """\
# Written by fl-sim run (fl_sim/apps/flwr_simulation.py): the app `flwr run` ships, whose
# components are the installed fl-sim's.
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fl-sim-run"
version = "1.0.0"
description = "fl-sim's audited federation"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "fl-sim"

[tool.flwr.app.components]
serverapp = "fl_sim.apps.flower_app:server"
clientapp = "fl_sim.apps.flower_app:client"

[tool.flwr.app.config]
scenario = ""
out = "runs"
run-dir = ""
control-dir = ""
"""


class FlwrRunError(RuntimeError):
    """The federation under ``flwr run`` did not start, failed or ended unfinished."""


def free_port() -> int:
    """A TCP port nothing listens on at the moment, on 127.0.0.1.

    Returns
    -------
    int
        The port.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Tail:
    """New complete lines of a growing file, read from where the last call stopped."""

    path: Path
    offset: int = 0

    def lines(self) -> list[str]:
        if not self.path.is_file():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [x for x in complete.decode(errors="replace").splitlines() if x.strip()]


class _Seen(logging.Handler):
    """Remembers the warnings logged in this process, so a relayed one is shown once."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.keys: set[tuple[str, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.keys.add((record.name, record.getMessage()))


@dataclass
class _Follower:
    """The run directory and control folder read into :class:`RunProgress` and the log."""

    run_dir: Path
    control: Path
    progress: RunProgress | None
    seen: _Seen
    rounds: _Tail = field(init=False)
    queued: _Tail = field(init=False)
    warnings: _Tail = field(init=False)

    def __post_init__(self) -> None:
        self.rounds = _Tail(self.run_dir / rundir.ROUNDS)
        self.queued = _Tail(self.control / QUEUED_FILE)
        self.warnings = _Tail(self.control / WARNINGS_FILE)

    def poll(self) -> None:
        """Show what was recorded since the last call."""
        for line in self.warnings.lines():
            row = json.loads(line)
            key = (str(row["logger"]), str(row["message"]))
            if key not in self.seen.keys:
                logging.getLogger(key[0]).log(int(row["level"]), "%s", key[1])
        if self.progress is None:
            return
        count = sum(int(x) for x in self.queued.lines())
        if count:
            self.progress.attacks_queued(count)
        rows = [json.loads(x) for x in self.rounds.lines()]
        if rows:
            clients = rundir.read_jsonl(self.run_dir / rundir.CLIENTS)
            for row in rows:
                done = int(row["round"])
                left_out = sum(
                    1 for c in clients if c.get("round") == done and c.get("status") != "ok"
                )
                self.progress.round_done(
                    done, float(row["test_accuracy"]), float(row["test_loss"]), left_out
                )


class FlwrSimulation:
    """One run of ``scenario`` under ``flwr run`` with the simulation runtime.

    Used as a context manager around what logs before the run too (``with FlwrSimulation(...)
    as launcher: ...; launcher.run()``), so that a warning is shown once.

    Parameters
    ----------
    scenario
        The run; its ``scenario.json`` (resolved) must already be in ``run_dir``.
    run_dir
        The run directory; the ServerApp records there, Flower's output goes to its
        ``run.log``.
    progress
        Where the rounds and attacks are shown (``None``: nowhere).
    """

    def __init__(self, scenario: Scenario, run_dir: Path, progress: RunProgress | None) -> None:
        self.scenario = scenario
        self.run_dir = run_dir.resolve()
        self.progress = progress
        self.run_id: int | None = None
        self._seen = _Seen()

    def __enter__(self) -> FlwrSimulation:
        """From here on the warnings logged in this process are remembered: the ServerApp's
        same warnings (the data it loads again, say) are not shown twice."""
        logging.getLogger().addHandler(self._seen)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        logging.getLogger().removeHandler(self._seen)

    def run(self) -> None:
        """Run the federation and return when it ended; the SuperLink is stopped however it
        ends.

        Raises
        ------
        FlwrRunError
            When the run did not start, failed, or ended without its global model.
        KeyboardInterrupt
            After Ctrl-C, once the ServerApp stopped (or was stopped) and the SuperLink too.
        """
        for stale, pids in stale_runs().items():
            listed = " ".join(map(str, pids))
            log.warning(
                "%d processes of an earlier fl-sim run are still running (they name %s), "
                "holding ports and memory: `kill %s` stops them",
                len(pids),
                stale,
                listed,
            )
        with tempfile.TemporaryDirectory(prefix=RUN_FOLDER_PREFIX) as tmp:
            base = Path(tmp)
            home, app, control = base / "home", base / "app", base / "control"
            for folder in (home, app, control):
                folder.mkdir()
            (home / "config.toml").write_text(
                f'[superlink]\ndefault = "{CONNECTION}"\n\n'
                f'[superlink.{CONNECTION}]\naddress = ":local:"\n'
            )
            (app / "pyproject.toml").write_text(_APP_PYPROJECT)
            run_config = base / "run_config.toml"
            run_config.write_text(
                f"{RUN_DIR_KEY} = {json.dumps(str(self.run_dir))}\n"
                f"{CONTROL_DIR_KEY} = {json.dumps(str(control))}\n"
            )
            env = self._env(home)
            command = [
                *(self._flwr(), "run", str(app), CONNECTION, "--stream"),
                *("--run-config", str(run_config)),
                *("--federation-config", self._federation_config()),
            ]
            log.info("flwr run: %s", " ".join(command))
            watchdog = start_watchdog(home)  # for a kill -9 of this process
            with (self.run_dir / rundir.RUN_LOG).open("a") as out:
                try:
                    self._run(command, env, out, control)
                finally:
                    try:
                        stopped = stop_superlink(home)
                    except KeyboardInterrupt:  # Ctrl-C again: it is stopped all the same
                        stop_superlink(home)
                        raise
                    finally:
                        watchdog.kill()
                        watchdog.wait()
                    log.info("stopped the local SuperLink and its processes: %s", stopped)

    def _run(self, command: list[str], env: dict[str, str], out: IO[str], control: Path) -> None:
        follower = _Follower(self.run_dir, control, self.progress, self._seen)
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            # Ctrl-C on the terminal reaches fl-sim alone, which stops the run in order.
            start_new_session=True,
        )
        assert proc.stdout is not None
        copier = threading.Thread(target=self._copy, args=(proc.stdout, out), daemon=True)
        copier.start()
        try:
            self._follow(proc, follower)
            copier.join(COMMAND_TIMEOUT_S)  # the output's end, and the run's id
            self._check(proc, env)
        except KeyboardInterrupt:
            self._interrupt(proc, env, follower, control)
            raise
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def _copy(self, stream: IO[str], out: IO[str]) -> None:
        """Flower's output into ``run.log``, without its colours, noting the run's id."""
        for line in stream:
            out.write(_COLOURS.sub("", line))
            out.flush()
            if self.run_id is None and (found := _STARTED.search(line)):
                self.run_id = int(found[1])

    def _follow(
        self, proc: subprocess.Popen[str], follower: _Follower, until: float | None = None
    ) -> None:
        """Show the progress until ``proc`` ends (or ``until``, a monotonic time, passes)."""
        while True:
            ended = proc.poll() is not None
            follower.poll()
            if ended or (until is not None and time.monotonic() > until):
                return
            time.sleep(POLL_S)

    def _check(self, proc: subprocess.Popen[str], env: dict[str, str]) -> None:
        """Raise :class:`FlwrRunError` unless the run finished completed, with its model."""
        if proc.returncode != 0 or self.run_id is None:
            raise FlwrRunError(
                f"flwr run exited with status {proc.returncode} without "
                f"{'finishing' if self.run_id else 'starting'} the run: see "
                f"{self.run_dir / rundir.RUN_LOG}"
            )
        status, details = self._status(env)
        if status != "finished:completed":
            raise FlwrRunError(
                f"run {self.run_id} ended {status} ({details}): see {self.run_dir / rundir.RUN_LOG}"
            )
        if not (self.run_dir / rundir.MODEL).is_file():
            raise FlwrRunError(
                f"run {self.run_id}'s ServerApp ended without the global model: see "
                f"{self.run_dir / rundir.RUN_LOG}"
            )

    def _status(self, env: dict[str, str]) -> tuple[str, str]:
        """``flwr ls``'s status of the run and its details."""
        listed = subprocess.run(
            [self._flwr(), "ls", CONNECTION, "--run-id", str(self.run_id), "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        try:
            (run,) = json.loads(listed.stdout)["runs"]
            return str(run["status"]), str(run.get("status-details", ""))
        except (ValueError, KeyError, TypeError) as err:
            raise FlwrRunError(
                f"flwr ls could not tell how run {self.run_id} ended ({err}): "
                f"{listed.stdout[-500:]}{listed.stderr[-500:]}"
            ) from None

    def _interrupt(
        self,
        proc: subprocess.Popen[str],
        env: dict[str, str],
        follower: _Follower,
        control: Path,
    ) -> None:
        """Ask the ServerApp to stop and give it :data:`STOP_GRACE_S` to file what is pending
        (a second Ctrl-C stops waiting); then ``flwr stop`` the run if it still goes."""
        (control / STOP_FILE).touch()
        log.info("Ctrl-C: asked the ServerApp to stop")
        try:
            self._follow(proc, follower, until=time.monotonic() + STOP_GRACE_S)
        except KeyboardInterrupt:
            log.warning("not waiting for the server to stop")
        if proc.poll() is None:
            if self.run_id is not None:
                log.warning("the server did not stop within %.0f s: flwr stop", STOP_GRACE_S)
                subprocess.run(
                    [self._flwr(), "stop", str(self.run_id), CONNECTION],
                    env=env,
                    capture_output=True,
                    timeout=COMMAND_TIMEOUT_S,
                    check=False,
                )
            proc.kill()

    def _federation_config(self) -> str:
        """``flwr run --federation-config``: one SuperNode per client, its resources."""
        return (
            f"num-supernodes={len(self.scenario.clients)} "
            f"client-resources-num-cpus={int(self.scenario.client_cpus)} "
            f"client-resources-num-gpus={float(self.scenario.client_gpus)}"
        )

    @staticmethod
    def _flwr() -> str:
        """The ``flwr`` beside this Python (the virtual environment's), else on ``PATH``."""
        beside = Path(sys.executable).parent / "flwr"
        return str(beside) if beside.is_file() else "flwr"

    @staticmethod
    def _env(home: Path) -> dict[str, str]:
        """The environment of ``flwr run`` and of the SuperLink it starts: the private
        ``FLWR_HOME``, free ports, no dependency installation (offline), this Python's tools
        first on ``PATH`` and this fl-sim first on ``PYTHONPATH``."""
        env = dict(os.environ)
        env["FLWR_HOME"] = str(home)
        env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(free_port())
        env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
        env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        source = str(Path(fl_sim.__file__).resolve().parents[1])
        if source not in site.getsitepackages():
            paths = [source, *env.get("PYTHONPATH", "").split(os.pathsep)]
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        return env
