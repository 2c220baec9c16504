"""What a Flower user's own app gets from its audit: progress lines per round and while the last
attacks finish, clients placed by their partition id (``declare_partition``), and a bulk in the
spectrum read by what the client declared of its local steps."""

from __future__ import annotations

import io
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from rich.console import Console

from clients.declare import declare_partition
from clients.reply import ARRAYS, CLIENT, PARTITION_ID
from fl_sim.audit.auditor import Auditor
from fl_sim.audit.context import AuditContext
from fl_sim.audit.log import NOISE_OR_STEPS, SEVERAL_STEPS, UNDECLARED_NOISE, spectrum_bulk
from fl_sim.config import AuditSpec
from fl_sim.progress import RunProgress


def _train_reply(node_config: dict[str, Any], with_arrays: bool = True) -> Message:
    msg = Message(RecordDict({}), dst_node_id=1, message_type="train")
    context = Context(
        run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={}
    )

    def app(m: Message, c: Context) -> Message:
        content = RecordDict()
        if with_arrays:
            content[ARRAYS] = ArrayRecord({"w": Array(np.zeros((2, 3)))})
        return Message(content, reply_to=m)

    return declare_partition(msg, context, app)


@pytest.mark.usefixtures("flower_identity")
def test_declare_partition_names_the_nodes_partition_in_training_replies() -> None:
    reply = _train_reply({"partition-id": 3, "num-partitions": 4})
    record = reply.content[CLIENT]
    assert isinstance(record, ConfigRecord) and record[PARTITION_ID] == 3
    # Nothing to declare: no partition in the node config, or a reply without an update.
    assert CLIENT not in _train_reply({}).content
    assert CLIENT not in _train_reply({"partition-id": 3}, with_arrays=False).content


@pytest.mark.parametrize(
    ("bulk", "declared", "reading"),
    [
        (False, {"steps": 12}, None),
        (None, {}, None),
        (True, {"steps": 12}, SEVERAL_STEPS),
        (True, {"steps": 1}, UNDECLARED_NOISE),
        (True, {}, NOISE_OR_STEPS),
        (True, {"steps": "many"}, NOISE_OR_STEPS),
    ],
)
def test_a_bulk_in_the_spectrum_is_read_by_the_declared_steps(
    bulk: bool | None, declared: dict[str, Any], reading: str | None
) -> None:
    assert spectrum_bulk(bulk, declared) == reading


def test_progress_of_an_app_per_round_and_while_the_audit_finishes(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = RunProgress(2, tmp_path, console=Console(file=out, force_terminal=False))
    with progress:
        progress.attacks_queued(2)
        progress.round_trained(1, "train-loss 2.100")
        progress.round_trained(2)
        progress.waiting(540.4)
    lines = [re.sub(r"\d+:\d\d:\d\d", "T", line) for line in out.getvalue().splitlines()]
    assert lines == [
        "round 1/2  train-loss 2.100  audit 0/2 attacks done  T",
        "round 2/2  audit 0/2 attacks done  T",
        "audit 0/2 attacks done, up to T left of wait_s  T",
        "audit 0/2 attacks done, T in all",
    ]


class _Slow:
    """An executor whose jobs all come back after ``seconds``."""

    on_this_machine = False

    def __init__(self, seconds: float) -> None:
        self.done = threading.Event()
        threading.Timer(seconds, self.done.set).start()

    def submit(self, job: Any, on_outcome: Any, on_error: Any) -> None:
        pass

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(max(0.0, timeout_s))

    def close(self) -> None:
        pass


def test_finish_says_how_long_it_still_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fl_sim.audit.auditor.WAITING_EVERY_S", 0.05)
    auditor = Auditor(AuditContext(AuditSpec(wait_s=10), tmp_path, 0, input_shape=(3,)))
    auditor._executor = _Slow(0.3)
    heard: list[float] = []
    started = time.monotonic()
    auditor.finish(waiting=heard.append)
    assert time.monotonic() - started < 5  # done when the jobs are, not after wait_s
    assert len(heard) >= 3 and heard == sorted(heard, reverse=True)
    assert all(9 < left < 10 for left in heard)
