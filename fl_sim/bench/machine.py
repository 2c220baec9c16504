"""Where a benchmark's figures were measured."""

from __future__ import annotations

import os
from typing import Any

from fl_sim.bench.attack import hardware


def machine() -> dict[str, Any]:
    """Platform, processor, torch and CUDA (as ``fl-sim bench attack`` records them), plus the
    number of cores and the physical memory in GiB."""
    pages = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {**hardware(), "cpu_count": os.cpu_count(), "memory_gib": pages / 2**30}


def measured_header(meta: dict[str, Any]) -> list[str]:
    """A results table's first lines: when and where it was measured, and the command."""
    hw = meta["hardware"]
    return [
        f"Measured {meta['finished']} on {hw['processor']}, {hw['cpu_count']} cores, "
        f"{hw['memory_gib']:.0f} GiB, CUDA: {hw['cuda']}; torch {hw['torch']}.",
        "",
        f"Command: `{meta['command']}`",
        "",
    ]
