"""Starting and stopping the servers integration tests need: free ports, readiness, teardown."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from fl_sim.proctree import descendants, stop_trees

VENV_BIN = Path(sys.executable).parent

# The federation the integration tests run on their servers: two clients of the offline photo
# set, a small network, a short SPEAR++ budget (tests add tables after it).
TWO_CLIENTS = """
rounds = 2
[data]
source = "photos"
samples_per_client = 20
test_size = 40
[model]
width = 60
depth = 3
[clients]
count = 2
batch_size = 6
[audit.spearpp]
starts = 500
steps = 500
max_passes = 2
[audit]
"""


@contextlib.contextmanager
def ctrl_c_reachable() -> Iterator[None]:
    """Processes started inside get SIGINT's default disposition, as from a terminal.

    A test run started as a background job of a shell without job control (``cmd &`` in a
    script) has SIGINT ignored (POSIX), and exec passes an ignored signal on: a Ctrl-C test's
    SIGINT would then never reach the command. A caught signal is reset to its default by exec,
    so the parent catches it while the child starts.
    """
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited)


class Processes:
    """Processes a test started, each logging to a file; ``stop`` ends them and their trees.

    Parameters
    ----------
    logs
        Folder for each process's combined stdout and stderr (``NAME.log``).
    """

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        """Start ``args`` as process ``name``."""
        with (self.logs / f"{name}.log").open("wb") as out:
            self.started[name] = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def log(self, name: str) -> str:
        """What process ``name`` wrote so far."""
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def wait_log(self, name: str, text: str, timeout_s: float) -> None:
        """Wait until ``text`` shows in the log of ``name``; fail with the log's end if the
        process exits first or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log(name):
            if self.started[name].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready: {self.log(name)[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every started process and its descendants, by pid; check none is left."""
        roots = [p.pid for p in self.started.values()]
        stop_trees(roots)
        for proc in self.started.values():
            proc.wait(timeout=30)
        left = [pid for root in roots for pid in descendants(root)]
        assert not left, f"processes left running: {left}"
