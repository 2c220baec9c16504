"""What every ``fl-sim bench`` command does alike: read CIFAR-10, name its results folder and
record the command line that made it."""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def record_row(
    out: Path,
    row: dict[str, Any],
    rows: list[dict[str, Any]],
    meta: dict[str, Any],
    markdown: Callable[[list[dict[str, Any]], dict[str, Any]], str],
) -> None:
    """Add a measured ``row`` to ``rows`` and to ``out/rows.jsonl``, then rewrite
    ``summary.json`` and ``summary.md`` (``meta`` stamped with the time): a benchmark stopped
    midway keeps every row it measured."""
    rows.append(row)
    with (out / "rows.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (out / "summary.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (out / "summary.md").write_text(markdown(rows, meta))
