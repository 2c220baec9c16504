"""What every ``fl-sim bench`` command does alike: read CIFAR-10, name its results folder and
record the command line that made it."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from fl_sim.data.cifar10 import ImageSet, load_cifar10


def bench_data(path: str, split: str = "test") -> ImageSet:
    """CIFAR-10 from an .npz (images, labels) or a folder holding cifar-10-batches-py.

    Raises
    ------
    SystemExit
        Naming the path and what is accepted, when nothing is there.
    """
    try:
        return load_cifar10(Path(path), split=split)
    except FileNotFoundError as err:
        raise SystemExit(
            f"CIFAR-10 not found: {err}. Pass --data with an .npz (images, labels) or a folder "
            "holding cifar-10-batches-py"
        ) from None


def results_folder(out: str | None, name: str) -> Path:
    """``out``, or ``bench/runs/NAME-TIME`` when not given."""
    return Path(out or f"bench/runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def command_line() -> str:
    """The running command as a user would retype it, for the results' records."""
    return "fl-sim " + " ".join(shlex.quote(a) for a in sys.argv[1:])
