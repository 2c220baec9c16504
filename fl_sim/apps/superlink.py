"""The local SuperLink ``flwr run`` starts for ``fl-sim run``: finding it, stopping it with every
process it started, and a watchdog that does so once ``fl-sim run`` itself is gone, however it
ended (``kill -9`` and the out-of-memory killer included: the SuperLink runs in a session of its
own, so neither a signal to ``fl-sim``'s process group nor its death reaches it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fl_sim.proctree import descendants, session_id, stop_trees

# The temporary folder of each fl-sim run on flwr run (FLWR_HOME, the app, the control folder):
# every process of the run names it on its command line.
RUN_FOLDER_PREFIX = "fl-sim-flwr-"
_RUN_FOLDER = re.compile(rf"/\S*?/{re.escape(RUN_FOLDER_PREFIX)}[^/\s]+")
# The watchdog's command line: this module, then the pid it watches and the FLWR_HOME.
_WATCHDOG = "fl_sim.apps.superlink"

# How often the watchdog looks for its parent, and how long what it stops may take to end
# before SIGKILL (after a kill -9 of fl-sim there is nothing left to end in order), in seconds.
_POLL_S = 0.5
_GRACE_S = 3.0


def superlink_pids(home: Path) -> list[int]:
    """The ``flower-superlink`` processes whose command line names ``home`` (the private
    ``FLWR_HOME`` whose ``local-superlink`` folder holds its log and database).

    Parameters
    ----------
    home
        The ``FLWR_HOME`` the SuperLink was started with.

    Returns
    -------
    list of int
        Their pids.
    """
    marker = str(home / "local-superlink")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.endswith("flower-superlink") for a in args) and any(marker in a for a in args):
            found.append(int(entry.name))
    return found


def stop_superlink(home: Path, grace_s: float = 15.0) -> list[int]:
    """Stop the local SuperLink started with ``home`` and every process it started: its tree,
    and what is left in the sessions its processes lead (Ray's workers, re-parented when
    their parent ended). Returns the pids it stopped.

    Parameters
    ----------
    home
        The ``FLWR_HOME`` the SuperLink was started with.
    grace_s
        Seconds between SIGTERM and SIGKILL.

    Returns
    -------
    list of int
        The processes that were running and were told to stop.
    """
    roots = superlink_pids(home)
    tree = {pid for root in roots for pid in descendants(root)}
    sessions = {pid for pid in tree if session_id(pid) == pid}
    orphans = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if sessions
        and entry.name.isdigit()
        and int(entry.name) not in tree
        and session_id(int(entry.name)) in sessions
    ]
    stop_trees(roots + orphans, grace_s)
    return sorted(tree | set(orphans))


def _command_lines() -> dict[int, list[str]]:
    """Every other process's arguments, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        found[int(entry.name)] = [a for a in args if a]
    return found


def stale_runs() -> dict[str, list[int]]:
    """Processes left by earlier ``fl-sim run``s on ``flwr run``, per run folder (the temporary
    folder their command lines name, ``.../fl-sim-flwr-*``): those of every folder no watchdog
    looks after (a live run has one; an older fl-sim, or one whose watchdog was killed too,
    leaves its SuperLink, SuperExec, simulation and Ray running with no one to stop them)."""
    watched: set[str] = set()
    named: dict[str, list[int]] = {}
    for pid, args in _command_lines().items():
        if _WATCHDOG in args[:-2]:
            watched.add(str(Path(args[args.index(_WATCHDOG) + 2]).parent))
            continue
        for folder in {m.group(0) for a in args for m in _RUN_FOLDER.finditer(a)}:
            named.setdefault(folder, []).append(pid)
    return {f: sorted(pids) for f, pids in sorted(named.items()) if f not in watched}


def start_watchdog(home: Path) -> subprocess.Popen[bytes]:
    """Start a process, in a session of its own, that stops the SuperLink of ``home`` (and what
    it started) once this process has ended, and then leaves; kill it once the SuperLink is
    stopped the ordinary way."""
    return subprocess.Popen(
        [sys.executable, "-m", _WATCHDOG, str(os.getpid()), str(home)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _naming(folder: Path) -> list[int]:
    """The processes but this one whose command line names ``folder`` (``flwr run`` of the
    run's app folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if str(folder).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def watch(parent: int, home: Path) -> None:
    """Wait for ``parent`` to end, then stop the SuperLink of ``home`` if one is left, and
    whatever else names the run's temporary folder (``home``'s parent)."""
    while _alive(parent):
        time.sleep(_POLL_S)
    stop_superlink(home, _GRACE_S)
    stop_trees(_naming(home.parent), _GRACE_S)


if __name__ == "__main__":
    watch(int(sys.argv[1]), Path(sys.argv[2]))
