"""The audit's executor interface and its registry.

An executor takes the audit's worker jobs (attacks, and the judge's proxy jobs) and reports
each outcome through a callback as soon as it is known, so the auditor files records while
rounds go on; ``wait`` drains what is left at the end of a run and ``close`` releases the
workers, after which no callback fires.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from dataclasses import Field

OnOutcome = Callable[[Any], None]
OnError = Callable[[BaseException], None]


class WorkerJob(Protocol):
    """A frozen dataclass of picklable settings whose arrays wait in an .npz file (so that
    executors can move them to another machine with ``dataclasses.replace``)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def arrays(self) -> str:
        """Path of the job's .npz file."""

    @property
    def peak_bytes(self) -> int:
        """Estimated memory the job takes above an idle worker's, at its peak."""

    def execute(self) -> Any:
        """Do the work, in whichever process the executor chose; the outcome is picklable."""


def run_worker_job(job: WorkerJob) -> Any:
    """Module-level entry point for worker processes."""
    return job.execute()


class AttackExecutor(Protocol):
    """Runs worker jobs somewhere and calls back with each result; ``on_this_machine`` says
    whether its workers share this machine's memory (then the audit's memory budget caps
    them)."""

    on_this_machine: bool

    def submit(self, job: WorkerJob, on_outcome: OnOutcome, on_error: OnError) -> None:
        """Queue ``job``; later exactly one of ``on_outcome`` (the job returned) or
        ``on_error`` (it raised, or its worker could not run it) is called, unless the
        executor is closed first."""

    def wait(self, timeout_s: float) -> bool:
        """Block until every submitted job has been reported, or ``timeout_s`` passed;
        whether all were reported."""

    def close(self) -> None:
        """Stop the workers (unfinished jobs are dropped); no callback fires afterwards."""
