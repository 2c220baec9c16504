"""The local SuperLink ``flwr run`` starts for ``fl-sim run``: finding it, stopping it with every
process it started, and a watchdog that does so once ``fl-sim run`` itself is gone, however it
ended (``kill -9`` and the out-of-memory killer included: the SuperLink runs in a session of its
own, so neither a signal to ``fl-sim``'s process group nor its death reaches it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fl_sim.proctree import descendants, session_id, stop_trees

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


def start_watchdog(home: Path) -> subprocess.Popen[bytes]:
    """Start a process, in a session of its own, that stops the SuperLink of ``home`` (and what
    it started) once this process has ended, and then leaves; kill it once the SuperLink is
    stopped the ordinary way."""
    return subprocess.Popen(
        [sys.executable, "-m", "fl_sim.apps.superlink", str(os.getpid()), str(home)],
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
