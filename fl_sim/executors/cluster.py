"""Where a run's work goes: the Ray cluster, and the executor that runs the attacks.

Defaults keep everything on this machine: a private local Ray for the simulated clients and a
local process pool for the reconstructions.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, field_validator

from fl_sim.executors.base import AttackExecutor
from flsim_plugins import Registry
from flsim_plugins.settings import Real, Settings, Str

ExecutorFactory = Callable[[int, "ClusterSpec"], AttackExecutor]
# Executor classes, each called with (workers, cluster) for a new executor; registered by the
# modules that implement them, named by ``cluster.attack_executor``.
EXECUTORS: Registry[ExecutorFactory] = Registry("attack executor", key="cluster.attack_executor")

RAY_ADDRESS_ENV = "RAY_ADDRESS"
# What ray.init accepts: a GCS address host:port, a Ray Client address ray://host:port, or
# "auto" (the cluster started last on this machine) and "local" (a fresh private one).
_ADDRESS = re.compile(r"(ray://)?[\w.\-]+:\d{1,5}")


def ray_amount(value: float) -> float:
    """A Ray resource amount: finite and >= 0."""
    if value < 0 or not math.isfinite(value):
        raise ValueError("must be a finite number >= 0")
    return value


def gpu_amount(value: float) -> float:
    """A GPU amount Ray can grant: a share of one GPU, or whole GPUs."""
    ray_amount(value)
    if value > 1 and not value.is_integer():
        raise ValueError("a share of one GPU (0 to 1) or whole GPUs")
    return value


CpuAmount = Annotated[Real, AfterValidator(ray_amount)]
GpuAmount = Annotated[Real, AfterValidator(gpu_amount)]


class ClusterSpec(Settings):
    """The Ray cluster a run uses and how its attacks are executed.

    Parameters
    ----------
    address
        Ray cluster for the simulation engine and for Ray attack workers: ``host:port`` of a
        running cluster's head, ``ray://host:port`` (Ray Client), ``auto`` or ``local``.
        Empty: the ``RAY_ADDRESS`` environment variable if set, else a private local Ray.
    attack_executor
        Where reconstructions run: ``pool`` (processes on this machine, ``audit.workers`` of
        them) or ``ray`` (Ray tasks on the cluster, at most ``audit.workers`` at a time).
    attack_cpus, attack_gpus
        Ray resources each attack task reserves (``ray`` only). Flower's simulation gives its
        client actors every CPU of every node, so CPU-reserving attacks wait until the
        simulation ends: on a shared cluster give attacks GPUs or a custom resource instead.
    attack_resource
        A custom Ray resource each attack task needs one unit of, e.g. ``attack`` on nodes
        started with ``ray start --resources '{"attack": 4}'`` (empty: none).
    """

    address: Str = ""
    attack_executor: Str = "pool"
    attack_cpus: CpuAmount = 0.0
    attack_gpus: GpuAmount = 0.0
    attack_resource: Str = ""

    @field_validator("address")
    @classmethod
    def _address(cls, address: str) -> str:
        if address not in ("", "auto", "local") and not _ADDRESS.fullmatch(address):
            raise ValueError(
                "expected host:port, ray://host:port, auto, local or empty (then "
                f"${RAY_ADDRESS_ENV}, else a local Ray)"
            )
        return address

    @field_validator("attack_executor")
    @classmethod
    def _executor(cls, name: str) -> str:
        if name not in EXECUTORS:
            raise ValueError(f"allowed are {', '.join(EXECUTORS.names())}")
        return name

    @field_validator("attack_resource")
    @classmethod
    def _resource(cls, name: str) -> str:
        if name and not re.fullmatch(r"[\w.\-]+", name):
            raise ValueError("a Ray resource name (letters, digits, '_', '-', '.')")
        return name

    def ray_address(self) -> str:
        """The address to give ``ray.init``: the configured one, else ``$RAY_ADDRESS``, else
        ``local``, so a run never joins a cluster it was not pointed at."""
        return self.address or os.environ.get(RAY_ADDRESS_ENV, "") or "local"
