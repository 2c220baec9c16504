"""Process trees on Linux, read from /proc: a process and its descendants, their memory, and
stopping them by pid.

Ray and Flower start daemons and workers under the process that launched them, so "the run's
memory" is the sum over its tree, and stopping a cluster means stopping that tree.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time): a pid that was reused by a new process no longer matches."""
    fields = _stat(pid)
    return None if fields is None else (pid, int(fields[19]))


def session_id(pid: int) -> int | None:
    """The session id of ``pid`` (None if it is gone)."""
    fields = _stat(pid)
    return None if fields is None else int(fields[3])


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it (zombies left out), parents first."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    root_fields = _stat(root)
    tree = [root] if root_fields is not None and root_fields[0] != "Z" else []
    for pid in tree:  # grows while iterating: breadth first
        tree.extend(children.get(pid, []))
    return tree


def process_name(pid: int) -> str:
    """``/proc/PID/comm``, or for a Python process what it runs: the script's file name, the
    ``-m`` module, or the module a ``-c`` snippet imports from (``multiprocessing.spawn``)."""
    comm = (_PROC / str(pid) / "comm").read_text().strip()
    if not comm.startswith("python"):
        return comm
    args = (_PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")[1:]
    for i, arg in enumerate(args):
        if arg in ("-m", "-c") and i + 1 < len(args):
            imported = re.search(r"from ([\w.]+) import", args[i + 1])
            return args[i + 1] if arg == "-m" else imported[1] if imported else "python -c"
        if not arg.startswith("-"):
            return Path(arg).name
    return comm


def _alive(identity: tuple[int, int]) -> bool:
    fields = _stat(identity[0])
    return fields is not None and fields[0] != "Z" and int(fields[19]) == identity[1]


@dataclass(frozen=True)
class TreeMemory:
    """Memory of a process tree at one moment.

    Attributes
    ----------
    rss
        Sum of resident set sizes, bytes (counts shared pages once per process: an upper bound).
    pss
        Sum of proportional set sizes, bytes (shared pages split among their users: the tree's
        share of physical memory).
    processes
        How many processes were counted.
    pss_by_name
        Per process name: PSS summed over the processes of that name, and their number.
    """

    rss: int
    pss: int
    processes: int
    pss_by_name: dict[str, tuple[int, int]]


def tree_memory(root: int) -> TreeMemory:
    """RSS and PSS summed over ``root``'s tree, from /proc/PID/smaps_rollup; PSS also per
    :func:`process_name` (``raylet``, ``ray::ClientAppA``, ``fl_sim.cli``...)."""
    rss = pss = count = 0
    by_name: dict[str, tuple[int, int]] = {}
    for pid in descendants(root):
        try:
            rollup = (_PROC / str(pid) / "smaps_rollup").read_text()
            name = process_name(pid)
        except OSError:  # exited meanwhile, or a kernel thread
            continue
        values = {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in rollup.splitlines()
            if line.startswith(("Rss:", "Pss:"))
        }
        rss += values.get("Rss", 0)
        pss += values.get("Pss", 0)
        total, n = by_name.get(name, (0, 0))
        by_name[name] = (total + values.get("Pss", 0), n + 1)
        count += 1
    return TreeMemory(rss, pss, count, by_name)


def tree_cpu_seconds(root: int) -> float:
    """CPU time (user + system) used so far by the live processes of ``root``'s tree."""
    ticks = 0
    for pid in descendants(root):
        fields = _stat(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def stop_trees(roots: list[int], grace_s: float = 15.0) -> list[int]:
    """Stop every process under ``roots`` (the roots included), by pid.

    The roots get SIGTERM first (``ray start --block`` and Flower's daemons then stop their
    own children), then whatever of the tree, as it was seen before, still lives gets SIGTERM
    and, after ``grace_s``, SIGKILL. Returns the pids that needed SIGKILL.
    """
    tree = [i for r in roots for p in descendants(r) if (i := _identity(p)) is not None]
    roots_set = set(roots)
    killed: list[int] = []
    for phase, sig in ((0, signal.SIGTERM), (1, signal.SIGTERM), (2, signal.SIGKILL)):
        targets = [i for i in tree if _alive(i) and (phase > 0 or i[0] in roots_set)]
        for pid, _ in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            if sig == signal.SIGKILL:
                killed.append(pid)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(i) for i in tree):
            time.sleep(0.1)
    return killed
