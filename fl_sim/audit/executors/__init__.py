"""Where the audit's jobs run: executors registered by name (``cluster.attack_executor``)."""

from fl_sim.audit.executors.base import (
    AttackExecutor,
    WorkerJob,
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
    "WorkerJob",
    "executor_names",
    "make_executor",
    "register_executor",
]
