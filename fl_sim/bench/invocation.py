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

import numpy as np

from fl_sim.data.cifar10 import ImageSet, load_cifar10
from fl_sim.data.imagefolder import SPLITS, load_image_folder

# What --data accepts, for every bench that reads images.
DATA_HELP = "CIFAR-10: .npz, a cifar-10-batches-py folder, or an image folder (train/, test/)"


def bench_data(path: str, split: str = "test") -> ImageSet:
    """CIFAR-10 from an .npz (images, labels), a folder holding cifar-10-batches-py, or
    ``split`` of a folder in ImageFolder layout (``train/<class>/*``, ``test/<class>/*``: the
    shared 60,000 JPEGs once extracted), 32 x 32 RGB images.

    Raises
    ------
    SystemExit
        Naming the path and what is accepted, when nothing is there.
    """
    where = Path(path)
    try:
        if all((where / name).is_dir() for name in SPLITS):
            return _folder_split(where, split)
        return load_cifar10(where, split=split)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(
            f"CIFAR-10 not found: {err}. Pass --data with an .npz (images, labels), a folder "
            "holding cifar-10-batches-py, or a folder with train/<class>/* and test/<class>/*"
        ) from None


def training_split(path: str, split: str, bench: str) -> ImageSet:
    """The training split that networks trained to convergence learn from, apart from the
    attacked ``split`` (which must be the test split).

    Raises
    ------
    SystemExit
        For an .npz (one set of images: the network would train on the attacked batch) or
        ``split`` other than test.
    """
    if split != "test" or Path(path).suffix == ".npz":
        raise SystemExit(
            f"fl-sim bench {bench}: converged networks train on a training split and are "
            "attacked on unseen test images; pass --data an image folder (train/, test/) or a "
            f"folder holding cifar-10-batches-py, with --split test (got --data {path} --split "
            f"{split})"
        )
    return bench_data(path, "train")


def _folder_split(root: Path, split: str) -> ImageSet:
    """One split of an image folder as the benches take images (N x 32 x 32 x 3 uint8)."""
    records = load_image_folder(root)
    assert records.held_out is not None  # an image folder always says its test split
    test = np.zeros(len(records.labels), dtype=bool)
    test[records.held_out] = True
    chosen = test if split == "test" else ~test
    images = np.ascontiguousarray(records.records[chosen].transpose(0, 2, 3, 1))
    return ImageSet(images, records.labels[chosen], f"{records.source}:{split}")


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
