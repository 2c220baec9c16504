"""Where attacks run: executors registered by name (``cluster.attack_executor``)."""

from fl_sim.audit.executors.base import (
    AttackExecutor,
    executor_names,
    make_executor,
    register_executor,
)
from fl_sim.audit.executors.pool import PoolExecutor
from fl_sim.audit.executors.ray_tasks import RayExecutor

__all__ = [
    "AttackExecutor",
    "PoolExecutor",
    "RayExecutor",
    "executor_names",
    "make_executor",
    "register_executor",
]
