"""Where a run's work goes: the Ray cluster, and the executor that runs the attacks.

Defaults keep everything on this machine: a private local Ray for the simulated clients and a
local process pool for the reconstructions.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from fl_sim.audit.executors import executor_names

RAY_ADDRESS_ENV = "RAY_ADDRESS"
# What ray.init accepts: a GCS address host:port, a Ray Client address ray://host:port, or
# "auto" (the cluster started last on this machine) and "local" (a fresh private one).
_ADDRESS = re.compile(r"(ray://)?[\w.\-]+:\d{1,5}")


def check_resources(cpus_key: str, cpus: float, gpus_key: str, gpus: float) -> None:
    """Reject Ray resource requests Ray cannot grant; the error names the key.

    Raises
    ------
    ValueError
        For negative or infinite amounts, or a GPU share above 1 that is not a whole number.
    """
    for key, value in ((cpus_key, cpus), (gpus_key, gpus)):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{key} = {value}: must be a finite number >= 0")
    if gpus > 1 and not gpus.is_integer():
        raise ValueError(f"{gpus_key} = {gpus}: a share of one GPU (0 to 1) or whole GPUs")


@dataclass(frozen=True)
class ClusterSpec:
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

    address: str = ""
    attack_executor: str = "pool"
    attack_cpus: float = 0.0
    attack_gpus: float = 0.0
    attack_resource: str = ""

    def __post_init__(self) -> None:
        if self.address not in ("", "auto", "local") and not _ADDRESS.fullmatch(self.address):
            raise ValueError(
                f"address = {self.address!r}: expected host:port, ray://host:port, auto, local "
                f"or empty (then ${RAY_ADDRESS_ENV}, else a local Ray)"
            )
        if self.attack_executor not in executor_names():
            raise ValueError(
                f"attack_executor = {self.attack_executor!r}: allowed are "
                f"{', '.join(executor_names())}"
            )
        check_resources("attack_cpus", self.attack_cpus, "attack_gpus", self.attack_gpus)
        if self.attack_resource and not re.fullmatch(r"[\w.\-]+", self.attack_resource):
            raise ValueError(
                f"attack_resource = {self.attack_resource!r}: a Ray resource name "
                "(letters, digits, '_', '-', '.')"
            )

    def ray_address(self) -> str:
        """The address to give ``ray.init``: the configured one, else ``$RAY_ADDRESS``, else
        ``local``, so a run never joins a cluster it was not pointed at."""
        return self.address or os.environ.get(RAY_ADDRESS_ENV, "") or "local"
