"""Where the audit's jobs run: executors registered by name (``cluster.attack_executor``)."""

from fl_sim.audit.executors.base import EXECUTORS, AttackExecutor, WorkerJob
from fl_sim.audit.executors.pool import PoolExecutor
from fl_sim.audit.executors.ray_tasks import RayExecutor

__all__ = [
    "EXECUTORS",
    "AttackExecutor",
    "PoolExecutor",
    "RayExecutor",
    "WorkerJob",
]
