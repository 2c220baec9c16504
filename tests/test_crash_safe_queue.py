"""A hard kill loses no queued attack: every update the audit queues is on disk until its last
record is written (then removed, unless ``keep_updates``), so a new audit of the run attacks
what the killed one never recorded."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fl_sim.audit.auditor import Auditor
from fl_sim.audit.context import AuditContext
from fl_sim.audit.log import AuditBusyError, AuditLog
from fl_sim.audit.updates import load_update
from fl_sim.config import AuditSpec
from fl_sim.rundir import AUDIT, UPDATES_DIR, read_jsonl
from tests.test_audit import _data, _update

SPEC = AuditSpec(wait_s=120, spearpp={"starts": 200, "steps": 200, "max_passes": 1})


class _Killed:
    """An executor whose process was killed before any job ran: nothing ever comes back."""

    def submit(self, job: Any, on_outcome: Any, on_error: Any) -> None:
        pass

    def wait(self, timeout_s: float) -> bool:
        return False

    def close(self) -> None:
        pass


def _stored(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / UPDATES_DIR).glob("*.npz"))


def test_queued_updates_survive_a_kill_and_are_attacked_by_the_next_audit(
    tmp_path: Path,
) -> None:
    first = Auditor(AuditContext(SPEC, tmp_path, 0, _data()))
    first._executor = _Killed()
    for client in (0, 1):
        first(_update(1, client))
    # Killed here: no record, no finish(); the queued updates are what is left, and the
    # kernel lets go of the dead process's audit lock.
    first.log.unlock()
    assert not read_jsonl(tmp_path / AUDIT)
    assert _stored(tmp_path) == ["r001-c000.npz", "r001-c001.npz"]
    log = AuditLog(tmp_path)
    resumed = Auditor(AuditContext(SPEC, tmp_path, 0, _data()).resumed(log.done()))
    for path in log.stored_updates():
        assert resumed.queue(load_update(path)) == 1
    resumed.finish()
    records = read_jsonl(tmp_path / AUDIT)
    assert sorted((r["round"], r["client"]) for r in records) == [(1, 0), (1, 1)]
    # Attacked this time (the random update is no real batch: what the attack made of it).
    assert all(r["seconds"] is not None and r["status"] != "timeout" for r in records), records
    assert _stored(tmp_path) == []  # recorded: not kept, as keep_updates is off


def test_keep_updates_keeps_them_after_their_records(tmp_path: Path) -> None:
    auditor = Auditor(
        AuditContext(SPEC.model_copy(update={"keep_updates": True}), tmp_path, 0, _data())
    )
    auditor(_update(1, 0))
    auditor.finish()
    assert len(read_jsonl(tmp_path / AUDIT)) == 1 and _stored(tmp_path) == ["r001-c000.npz"]


_HOLD = """
import sys, time
from pathlib import Path
from fl_sim.audit.log import AuditBusyError, AuditLog
held = AuditLog(Path(sys.argv[1]), lock=True)
print("locked", flush=True)
time.sleep(600)
"""


def test_one_audit_at_a_time_and_a_killed_ones_lock_is_free(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        busy = f"{tmp_path} is being audited by process {holder.pid}: wait for it to end"
        with pytest.raises(AuditBusyError, match=re.escape(busy)):
            Auditor(AuditContext(SPEC, tmp_path, 0, _data()))
    finally:
        holder.kill()  # as kill -9 would
        holder.wait()
    auditor = Auditor(AuditContext(SPEC, tmp_path, 0, _data()))
    auditor.finish()
