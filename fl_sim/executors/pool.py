"""Audit jobs in a pool of worker processes on this machine (the default)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.pool import AsyncResult, Pool
from typing import Any

import torch

from fl_sim.executors.base import OnError, OnOutcome, WorkerJob, run_worker_job
from fl_sim.executors.cluster import EXECUTORS, ClusterSpec


def _init_worker(threads: int) -> None:
    """Each worker: ``threads`` torch threads, and deaf to Ctrl-C, which reaches the whole
    process group: the server records the jobs in flight and terminates the workers itself,
    rather than each printing its KeyboardInterrupt and leaving its job unanswered (one that
    is still starting, importing torch, prints it all the same)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)


@EXECUTORS.register("pool")
class PoolExecutor:
    """``workers`` spawned processes, started at the first job, sharing the machine's cores:
    each uses cores // workers torch threads (at least one), whose OpenMP threads sleep rather
    than spin while they wait (the cores are shared with Flower's clients).

    Parameters
    ----------
    workers
        Processes, hence attacks running at once.
    cluster
        Unused: the pool stays on this machine.
    """

    on_this_machine = True

    def __init__(self, workers: int, cluster: ClusterSpec) -> None:
        self.workers = workers
        self._pool: Pool | None = None
        self._results: list[AsyncResult[Any]] = []
        # Jobs are submitted from the caller's thread and, through a wrapper such as the
        # memory budget, from the pool's result thread.
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, job: WorkerJob, on_outcome: OnOutcome, on_error: OnError) -> None:
        """Queue ``job`` in the pool; its callback runs in the pool's result thread. After
        :meth:`close` the job is dropped, unreported."""
        with self._lock:
            if not self._closed:
                self._submit(job, on_outcome, on_error)

    def _submit(self, job: WorkerJob, on_outcome: OnOutcome, on_error: OnError) -> None:
        if self._pool is None:
            threads = max(1, (os.cpu_count() or 1) // self.workers)
            # Read by OpenMP when a worker loads torch, so it must be in the environment the
            # workers inherit. Spinning threads on busy cores made attacks 6 to 24 times slower
            # (docs/scaling.md); a setting of the user's own is kept.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            # spawn, not fork: the server process holds threads (Flower's, gRPC's).
            self._pool = multiprocessing.get_context("spawn").Pool(
                self.workers, initializer=_init_worker, initargs=(threads,)
            )
        self._results = [r for r in self._results if not r.ready()]
        self._results.append(
            self._pool.apply_async(
                run_worker_job, (job,), callback=on_outcome, error_callback=on_error
            )
        )

    def wait(self, timeout_s: float) -> bool:
        """Wait for every queued job, ``timeout_s`` in all."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            results = list(self._results)
        for result in results:
            result.wait(max(0.0, deadline - time.monotonic()))
        return all(r.ready() for r in results)

    def close(self) -> None:
        """Terminate the workers (terminate joins the result thread: no late callbacks). The
        lock is not held meanwhile: a callback in that thread may be submitting."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()
            pool.join()
