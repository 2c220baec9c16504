"""Where a benchmark's figures were measured."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch


def hardware() -> dict[str, Any]:
    """Where the numbers were measured: platform, processor, torch threads, torch, CUDA."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def measured_on(hw: dict[str, Any]) -> str:
    """``hardware()`` in a results table's words."""
    return (
        f"{hw['processor']} ({hw['cpu_threads']} threads, CUDA: {hw['cuda']}), torch {hw['torch']}"
    )


def machine() -> dict[str, Any]:
    """``hardware()`` plus the number of cores and the physical memory in GiB."""
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
