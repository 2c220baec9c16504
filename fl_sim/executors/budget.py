"""The audit's memory as a budget: jobs are started only while their estimated peaks fit.

An attack that meets the out-of-memory killer takes its worker, its record and sometimes the
federation with it. :class:`MemoryBudget` wraps the executor that runs jobs on this machine:
a job waits until its estimate (``WorkerJob.peak_bytes``, the attack's own, above an idle
worker) fits beside the jobs running, and one that could never fit is reported at once with
:class:`OverBudgetError`, without running.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fl_sim.executors.base import AttackExecutor, OnError, OnOutcome, WorkerJob

GB = 1e9
# Resident memory of an idle attack worker (a spawned process that imported torch): 528 MB
# measured with torch 2.14 on the CPU, with a margin for the peak while it imports.
IDLE_WORKER_BYTES = 600_000_000
# The default budget: this share of the machine's memory.
DEFAULT_SHARE = 0.5


def machine_memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def budget_bytes(max_memory_gb: float | None) -> int:
    """The budget ``audit.max_memory_gb`` sets, or half the machine's memory when unset."""
    if max_memory_gb is None:
        return int(DEFAULT_SHARE * machine_memory_bytes())
    return int(max_memory_gb * GB)


def worker_peak_gb(peak_bytes: int) -> float:
    """A job's estimate as its worker's peak: the idle worker and the job's own, in GB."""
    return round((IDLE_WORKER_BYTES + peak_bytes) / GB, 3)


def reset_peak_rss() -> None:
    """Start this process's peak resident memory afresh (Linux: ``clear_refs``), so that
    :func:`peak_rss_bytes` measures what follows; elsewhere a no-op."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory since :func:`reset_peak_rss` (Linux: ``VmHWM``);
    None where the system does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class OverBudgetError(MemoryError):
    """A job whose estimated peak does not fit the budget even with no other job running."""

    def __init__(self, estimate: int, budget: int, workers: int) -> None:
        self.estimate = estimate
        self.budget = budget
        others = workers - 1
        super().__init__(
            f"its worker's estimated peak, {worker_peak_gb(estimate):.2f} GB, beside {others} "
            f"other idle worker(s) ({others * IDLE_WORKER_BYTES / GB:.1f} GB), does not fit "
            f"audit.max_memory_gb={budget / GB:.2f}"
        )


@dataclass(frozen=True)
class _Waiting:
    job: WorkerJob
    on_outcome: OnOutcome
    on_error: OnError


class MemoryBudget:
    """An executor that passes jobs on to ``inner`` while they fit ``budget`` bytes together
    with ``workers`` idle workers; the others wait, in order, for memory to free.

    Parameters
    ----------
    inner
        The executor that runs the jobs (on this machine).
    budget
        Bytes the workers may take together.
    workers
        The inner executor's processes: each holds :data:`IDLE_WORKER_BYTES` while idle.
    """

    on_this_machine = True

    def __init__(self, inner: AttackExecutor, budget: int, workers: int) -> None:
        self.inner = inner
        self.budget = budget
        self.workers = workers
        self._free = budget - workers * IDLE_WORKER_BYTES
        self._cond = threading.Condition()
        self._waiting: deque[_Waiting] = deque()
        self._running = 0
        self._unreported = 0
        self._closed = False

    def submit(self, job: WorkerJob, on_outcome: OnOutcome, on_error: OnError) -> None:
        """Queue ``job``; one over the budget alone is reported at once
        (:class:`OverBudgetError`)."""
        if job.peak_bytes > self.budget - self.workers * IDLE_WORKER_BYTES:
            on_error(OverBudgetError(job.peak_bytes, self.budget, self.workers))
            return
        with self._cond:
            self._waiting.append(_Waiting(job, on_outcome, on_error))
            self._unreported += 1
        self._start_what_fits()

    def wait(self, timeout_s: float) -> bool:
        """Wait until every job was reported, ``timeout_s`` at most."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            return self._cond.wait_for(
                lambda: self._unreported == 0, max(0.0, deadline - time.monotonic())
            )

    def close(self) -> None:
        """Close the inner executor; the jobs still waiting are dropped, unreported."""
        with self._cond:
            self._closed = True
            self._waiting.clear()
        self.inner.close()

    def _start_what_fits(self) -> None:
        """Pass on the waiting jobs, oldest first, while the first fits (no overtaking: a large
        job is not starved by a stream of small ones); with none running, the first always
        starts, since it fits alone."""
        starting: list[_Waiting] = []
        with self._cond:
            while self._waiting and not self._closed:
                job = self._waiting[0].job
                if self._running and job.peak_bytes > self._free:
                    break
                starting.append(self._waiting.popleft())
                self._free -= job.peak_bytes
                self._running += 1
        for entry in starting:
            self.inner.submit(
                entry.job,
                on_outcome=self._reporter(entry.job, entry.on_outcome),
                on_error=self._reporter(entry.job, entry.on_error),
            )

    def _reporter(self, job: WorkerJob, callback: Callable[[Any], None]) -> OnOutcome:
        def report(arg: Any) -> None:
            try:
                callback(arg)
            finally:
                with self._cond:
                    self._free += job.peak_bytes
                    self._running -= 1
                    self._unreported -= 1
                    self._cond.notify_all()
                self._start_what_fits()

        return report
