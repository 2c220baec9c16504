"""The audit's memory as a budget: attacks start only while their estimated peaks fit beside
the idle workers and the attacks running; one that never fits is recorded ``out_of_memory``
with its estimate, its update kept, and a later audit under a larger budget redoes it."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from attacks import ATTACKS, ServerView
from attacks.spearpp import SpearConfig
from attacks.spearpp.memory import peak_bytes
from fl_sim.audit.auditor import Auditor
from fl_sim.audit.context import AuditContext
from fl_sim.audit.log import AuditLog
from fl_sim.audit.updates import load_update
from fl_sim.config import AuditSpec
from fl_sim.executors.budget import (
    IDLE_WORKER_BYTES,
    MemoryBudget,
    OverBudgetError,
    budget_bytes,
    machine_memory_bytes,
    worker_peak_gb,
)
from fl_sim.rundir import AUDIT, OUT_OF_MEMORY, UPDATES_DIR, read_jsonl
from tests.test_audit import _data, _update

MB = 1_000_000


@dataclass(frozen=True)
class _Job:
    name: str
    peak_bytes: int
    arrays: str = ""

    def execute(self) -> str:
        return self.name


class _Threads:
    """Runs each job on a thread of its own after a short sleep; remembers the estimates of
    the jobs running together at their worst."""

    on_this_machine = True

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.worst = 0
        self.started: list[str] = []

    def submit(self, job: Any, on_outcome: Any, on_error: Any) -> None:
        with self.lock:
            self.running += job.peak_bytes
            self.worst = max(self.worst, self.running)
            self.started.append(job.name)

        def run() -> None:
            time.sleep(0.02)
            with self.lock:
                self.running -= job.peak_bytes
            on_outcome(job.execute())

        threading.Thread(target=run).start()

    def wait(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


def test_jobs_run_together_only_while_their_estimates_fit() -> None:
    inner = _Threads()
    budget = MemoryBudget(inner, IDLE_WORKER_BYTES + 100 * MB, workers=1)
    done: list[str] = []
    errors: list[BaseException] = []
    peaks = [60, 30, 50, 100, 10, 40, 70, 20, 101, 90]
    for i, peak in enumerate(peaks):
        budget.submit(_Job(f"j{i}", peak * MB), done.append, errors.append)
    assert budget.wait(30)
    # The one over the budget alone is refused at once, with its estimate; the rest all ran,
    # in order, never more than 100 MB of estimates at once.
    assert [type(e) for e in errors] == [OverBudgetError]
    assert isinstance(errors[0], OverBudgetError) and errors[0].estimate == 101 * MB
    assert sorted(done) == sorted(f"j{i}" for i, p in enumerate(peaks) if p <= 100)
    assert inner.started == [f"j{i}" for i, p in enumerate(peaks) if p <= 100]
    assert 0 < inner.worst <= 100 * MB
    budget.close()


def test_close_drops_the_jobs_still_waiting() -> None:
    class _Never(_Threads):
        def submit(self, job: Any, on_outcome: Any, on_error: Any) -> None:
            self.started.append(job.name)  # runs for ever: nothing comes back

    inner = _Never()
    budget = MemoryBudget(inner, IDLE_WORKER_BYTES + 100 * MB, workers=1)
    reported: list[Any] = []
    for i in range(3):
        budget.submit(_Job(f"j{i}", 60 * MB), reported.append, reported.append)
    assert inner.started == ["j0"]  # the others wait for its memory
    assert not budget.wait(0.05)
    budget.close()
    assert inner.started == ["j0"] and reported == []


def test_the_default_budget_is_half_the_machine_and_must_hold_the_idle_workers() -> None:
    assert budget_bytes(None) == machine_memory_bytes() // 2
    assert budget_bytes(2.5) == 2_500_000_000
    with pytest.raises(ValidationError, match=r"does not hold audit\.workers=2 idle"):
        AuditSpec(max_memory_gb=1.0, workers=2)
    with pytest.raises(ValidationError):
        AuditSpec(max_memory_gb=-1.0)


@pytest.mark.parametrize(("m", "batch"), [(200, 20), (1000, None), (4000, 512)])
def test_spearpp_estimate_grows_with_the_layer_and_is_capped_in_the_batch(
    m: int, batch: int | None
) -> None:
    cap = peak_bytes(m, 3072, None, SpearConfig().max_elements)
    estimate = peak_bytes(m, 3072, batch, SpearConfig().max_elements)
    # The five copies of the m x n arrays are always counted; the search never more than its cap.
    assert 5 * m * 3072 * 8 < estimate <= cap
    rng = np.random.default_rng(0)
    view = ServerView(
        weights={"w": rng.standard_normal((m, 3072)), "b": np.zeros(m)},
        gradient={"w": rng.standard_normal((m, 3072)), "b": np.zeros(m)},
        first_layer=("w", "b"),
        batch_size=batch,
    )
    assert ATTACKS["spearpp"].peak_bytes(view, SpearConfig()) == estimate


SPEC = {"wait_s": 120, "spearpp": {"starts": 200, "steps": 200, "max_passes": 1}}


def test_an_attack_over_the_budget_is_recorded_and_redone_under_a_larger_one(
    tmp_path: Path,
) -> None:
    # One idle worker and 1 MB beside it: SPEAR++ on a 20 x 3072 layer is estimated at 5.7 MB.
    small = AuditSpec.model_validate({**SPEC, "max_memory_gb": 0.601})
    auditor = Auditor(AuditContext(small, tmp_path, 0, _data()))
    auditor(_update(1, 0))
    auditor.finish()
    (record,) = read_jsonl(tmp_path / AUDIT)
    assert record["status"] == OUT_OF_MEMORY
    assert record["memory_estimate_gb"] == worker_peak_gb(
        peak_bytes(20, 3072, None, SpearConfig().max_elements)
    )
    assert "does not fit audit.max_memory_gb=0.60" in record["reason"]
    assert (tmp_path / UPDATES_DIR / "r001-c000.npz").is_file()  # kept for the redo

    log = AuditLog(tmp_path)
    context = AuditContext(small, tmp_path, 0, _data()).with_memory_budget(2.0)
    resumed = Auditor(context.resumed(log.done()))
    log.forget_cut_short()
    for path in log.stored_updates():
        assert resumed.queue(load_update(path)) == 1
    resumed.finish()
    (redone,) = read_jsonl(tmp_path / AUDIT)
    assert redone["status"] not in (OUT_OF_MEMORY, "timeout", "error"), redone
    # The worker measured its own peak: a process that imported torch and attacked.
    assert redone["memory_peak_gb"] > 0.2
    assert not (tmp_path / UPDATES_DIR / "r001-c000.npz").exists()


MEASURED = Path(__file__).resolve().parents[1] / "bench" / "results" / "memory" / "rows.jsonl"


def test_the_estimate_bounds_every_peak_measured_in_the_audits_workers() -> None:
    """The results row ``memory``: each worker's measured peak at or below the estimate the
    audit schedules by (today's estimator on the row's B and m, the batch size declared)."""
    rows = [json.loads(line) for line in MEASURED.read_text().splitlines()]
    assert len(rows) >= 8 and all(r["peak_gb"] for r in rows)
    for r in rows:
        bound = peak_bytes(r["width"], 3072, r["batch_size"], SpearConfig().max_elements)
        assert worker_peak_gb(bound) >= r["peak_gb"], r


def test_a_declared_batch_size_bounds_the_estimate_and_a_bad_one_is_ignored(
    tmp_path: Path,
) -> None:
    """Scheduling is not attacking: the size a client declares in the clear narrows the
    estimate though the attack is not told it; a size that is no count leaves the layer's bound."""
    auditor = Auditor(
        AuditContext(AuditSpec.model_validate({**SPEC, "max_memory_gb": 0.601}), tmp_path, 0)
    )
    for client, size in ((0, 3), (1, "three"), (2, None)):
        update = _update(1, client, m=200)
        declared = {**update.declared, **({"batch-size": size} if size is not None else {})}
        auditor(replace(update, declared=declared))
    auditor.finish()
    estimates = {r["client"]: r["memory_estimate_gb"] for r in read_jsonl(tmp_path / AUDIT)}
    chunk = SpearConfig().max_elements
    bound = worker_peak_gb(peak_bytes(200, 3072, None, chunk))
    assert estimates == {0: worker_peak_gb(peak_bytes(200, 3072, 3, chunk)), 1: bound, 2: bound}
    assert estimates[0] < bound
