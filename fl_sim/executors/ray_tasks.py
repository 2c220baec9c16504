"""Attacks as Ray tasks: many clients' updates reconstructed at once across a cluster's GPUs
(or CPUs), each outcome reported as soon as its task returns.

A task carries the job's .npz bytes, not its path: the run directory lives on the driver's
machine and the task may run on any node. In the simulation, Ray is already connected by
Flower's engine and the tasks share its cluster; elsewhere (deployment, ``fl-sim audit``) the
executor connects itself, to ``cluster.address`` or ``$RAY_ADDRESS`` or a local Ray.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from fl_sim.executors.base import OnError, OnOutcome, WorkerJob
from fl_sim.executors.cluster import EXECUTORS, ClusterSpec

log = logging.getLogger(__name__)

# How often the dispatcher looks for new jobs and for close() while tasks run.
_POLL_S = 0.1


def attack_task(job: WorkerJob, arrays: bytes) -> bytes:
    """Body of one Ray task: the job's arrays written to a local file, then the job (an attack
    or the judge's proxies); the outcome comes back pickled (Ray would hand its arrays back
    read-only, from its store).

    The device follows what Ray granted: CUDA when the task holds a GPU (the engine's
    ``device="auto"`` sees only the granted ones), else the CPU, with as many threads as CPUs
    granted (at least one).
    """
    import ray

    if not ray.get_gpu_ids():
        # Ray leaves CUDA_VISIBLE_DEVICES alone for GPU-less tasks when
        # RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0 (set to quiet its warnings): hide the GPUs.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    granted = ray.get_runtime_context().get_assigned_resources()  # type: ignore[no-untyped-call]
    cpus = granted.get("CPU", 0.0)
    torch.set_num_threads(max(1, math.floor(cpus)))
    with tempfile.TemporaryDirectory(prefix="fl-sim-attack-") as tmp:
        path = Path(tmp) / "job.npz"
        path.write_bytes(arrays)
        return pickle.dumps(replace(job, arrays=str(path)).execute())


@dataclass(frozen=True)
class _Entry:
    job: WorkerJob
    on_outcome: OnOutcome
    on_error: OnError


@EXECUTORS.register("ray")
class RayExecutor:
    """Ray tasks with ``cluster``'s resources, at most ``workers`` in flight.

    Jobs beyond ``workers`` wait here, not in Ray's object store, so a long queue costs no
    cluster memory. A dispatcher thread launches tasks and reports results as they finish.

    Parameters
    ----------
    workers
        Attacks in flight at most (Ray may run fewer when resources are short).
    cluster
        Address and per-task resources (``attack_cpus``, ``attack_gpus``,
        ``attack_resource``).
    """

    # Ray places tasks by its own resources and stops those its memory monitor flags; the
    # audit's budget is for this machine's pool.
    on_this_machine = False

    def __init__(self, workers: int, cluster: ClusterSpec) -> None:
        self.workers = workers
        self.cluster = cluster
        self._cond = threading.Condition()
        self._queue: deque[_Entry] = deque()
        self._unreported = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    def submit(self, job: WorkerJob, on_outcome: OnOutcome, on_error: OnError) -> None:
        """Queue ``job``; the dispatcher (started with the first job) launches it."""
        with self._cond:
            if self._closing:
                raise RuntimeError("the Ray executor is closed")
            self._queue.append(_Entry(job, on_outcome, on_error))
            self._unreported += 1
            if self._thread is None:
                # A daemon: a server that dies without close() must not hang on it.
                self._thread = threading.Thread(
                    target=self._dispatch, name="ray-attacks", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Wait until every submitted job was reported, ``timeout_s`` at most."""
        with self._cond:
            return self._cond.wait_for(lambda: self._unreported == 0, timeout_s)

    def close(self) -> None:
        """Cancel what still runs, stop the dispatcher; disconnect if it connected."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    # -- the dispatcher thread -------------------------------------------------------------

    def _dispatch(self) -> None:
        import ray

        owns_ray = not ray.is_initialized()
        running: dict[Any, _Entry] = {}
        try:
            if owns_ray:
                address = self.cluster.ray_address()
                ray.init(
                    address=address,
                    logging_level=logging.ERROR,
                    log_to_driver=False,
                    include_dashboard=False,
                )
            task = self._task(ray)
            if not owns_ray and self.cluster.attack_cpus > 0:
                log.warning(
                    "attack_cpus = %s on a Ray connection made before (by Flower's simulation "
                    "engine in fl-sim run, whose client actors hold every CPU of every node "
                    "while the run lasts): attacks that reserve CPUs may then never start "
                    "(reserve GPUs or attack_resource instead: docs/scaling.md)",
                    self.cluster.attack_cpus,
                )
        except Exception as err:  # unreachable cluster, or no node fits a task: every job fails
            self._fail_queued(err)
            if owns_ray and ray.is_initialized():
                ray.shutdown()
            return
        try:
            while self._launch(task, running):
                if running:
                    ready, _ = ray.wait(list(running), num_returns=1, timeout=_POLL_S)
                    for ref in ready:
                        self._report(ray, ref, running.pop(ref))
        finally:
            for ref in running:
                ray.cancel(ref, force=True)
            if owns_ray:
                ray.shutdown()

    def _task(self, ray: Any) -> Any:
        """The remote attack with this executor's resources, once a node can run it."""
        need = {"CPU": self.cluster.attack_cpus, "GPU": self.cluster.attack_gpus}
        if self.cluster.attack_resource:
            need[self.cluster.attack_resource] = 1.0
        need = {k: v for k, v in need.items() if v > 0}
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
        if not any(all(r.get(k, 0.0) >= v for k, v in need.items()) for r in nodes):
            offered = [{k: v for k, v in r.items() if not k.startswith("node:")} for r in nodes]
            raise RuntimeError(f"no node of the Ray cluster offers {need} (nodes: {offered})")
        log.info(
            "attacks as Ray tasks (%s each, %d at a time) on %d node(s)",
            need or "no reserved resources",
            self.workers,
            len(nodes),
        )
        options: dict[str, Any] = {
            "num_cpus": self.cluster.attack_cpus,
            "num_gpus": self.cluster.attack_gpus,
            "max_retries": 0,  # a crashed attack is recorded, not silently rerun
        }
        if self.cluster.attack_resource:
            options["resources"] = {self.cluster.attack_resource: 1.0}
        return ray.remote(attack_task).options(**options)

    def _launch(self, task: Any, running: dict[Any, _Entry]) -> bool:
        """Start queued jobs while slots are free (waiting when idle); False once closing."""
        with self._cond:
            while not self._closing and not running and not self._queue:
                self._cond.wait()
            if self._closing:
                return False
            starting: list[_Entry] = []
            while self._queue and len(running) + len(starting) < self.workers:
                starting.append(self._queue.popleft())
        for entry in starting:
            try:
                data = Path(entry.job.arrays).read_bytes()
            except OSError as err:
                self._call(entry.on_error, err)
                continue
            running[task.remote(entry.job, data)] = entry
        return True

    def _report(self, ray: Any, ref: Any, entry: _Entry) -> None:
        try:
            outcome = pickle.loads(ray.get(ref))
        except ray.exceptions.RayTaskError as err:
            # The attack's own exception, as the process pool would report it.
            cause = err.cause
            self._call(entry.on_error, cause if isinstance(cause, BaseException) else err)
        except ray.exceptions.RayError as err:  # worker crashed, object lost, cancelled
            self._call(entry.on_error, err)
        else:
            self._call(entry.on_outcome, outcome)

    def _fail_queued(self, err: BaseException) -> None:
        """Report ``err`` for every job, also those submitted later, until closed."""
        log.error("Ray attack executor unusable: %s", err)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or bool(self._queue))
                if self._closing:
                    return
                failed = list(self._queue)
                self._queue.clear()
            for entry in failed:
                self._call(entry.on_error, err)

    def _call(self, callback: Callable[[Any], None], arg: Any) -> None:
        try:
            callback(arg)
        except Exception:  # a failing callback must not stop the dispatcher
            log.exception("attack callback failed")
        finally:
            with self._cond:
                self._unreported -= 1
                self._cond.notify_all()
