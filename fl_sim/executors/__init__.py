"""Where the audit's jobs run: executors registered by name (``cluster.attack_executor``), and
the ``[cluster]`` table that picks one and says where its workers are."""

from fl_sim.executors.base import AttackExecutor, WorkerJob
from fl_sim.executors.cluster import EXECUTORS, ClusterSpec
from fl_sim.executors.pool import PoolExecutor
from fl_sim.executors.ray_tasks import RayExecutor

__all__ = [
    "EXECUTORS",
    "AttackExecutor",
    "ClusterSpec",
    "PoolExecutor",
    "RayExecutor",
    "WorkerJob",
]
