"""The server against its clients: error replies, declared failures and garbage are recorded and
left out, the rest aggregated exactly as FedAvg does, and a round without any keeps the model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from clients.reply import (
    ARRAYS,
    AUDIT,
    CLIENT,
    CLIENT_ERROR,
    DIVERGED,
    METRICS,
    NUM_EXAMPLES,
    PARTITION_ID,
    REASON,
    REJECTED,
    SAMPLE_IDS,
    STATUS,
)
from strategies import FaultTolerant, HonestButCurious, InterceptedUpdate, LeftOut

LAYER = ("1.weight", "1.bias")


@pytest.fixture(autouse=True)
def _identity() -> Iterator[None]:
    """Messages made outside a running app need an identity; restored afterwards."""
    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before


def _numpy(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "1.weight": rng.standard_normal((4, 6)),
        "1.bias": rng.standard_normal(4),
        "3.weight": rng.standard_normal((2, 4)),
    }


def _arrays(seed: int, **changed: np.ndarray | None) -> ArrayRecord:
    arrays = {**_numpy(seed), **changed}
    return ArrayRecord({k: Array(v) for k, v in arrays.items() if v is not None})


def _sent(node: int) -> Message:
    return Message(RecordDict({}), dst_node_id=node, message_type=MessageType.TRAIN)


def _reply(
    node: int,
    arrays: ArrayRecord | None,
    examples: float = 10,
    declared: dict[str, Any] | None = None,
    **records: Any,
) -> Message:
    content = RecordDict(
        {
            METRICS: MetricRecord({NUM_EXAMPLES: examples}),  # type: ignore[dict-item]
            CLIENT: ConfigRecord({PARTITION_ID: node - 1, STATUS: "ok", **(declared or {})}),
            AUDIT: ConfigRecord({SAMPLE_IDS: [1, 2, 3]}),
            **records,
        }
    )
    if arrays is not None:
        content[ARRAYS] = arrays
    return Message(content, reply_to=_sent(node))


def _error(node: int) -> Message:
    return Message(Error(code=2, reason="ValueError:<'boom'>"), reply_to=_sent(node))


def _tolerant(seen: list[LeftOut], inner: Any = None) -> FaultTolerant:
    strategy = FaultTolerant(inner or FedAvg(), seen.append)
    strategy._sent = {k: v.shape for k, v in _numpy(0).items()}
    return strategy


def _good() -> list[Message]:
    return [_reply(1, _arrays(1)), _reply(2, _arrays(2), examples=20)]


GARBAGE = [
    (None, {}, "not one 'arrays'"),
    (_arrays(9, **{"1.weight": np.full((4, 6), np.nan)}), {}, "1.weight holds NaN"),
    (_arrays(9, **{"3.weight": np.full((2, 4), np.inf)}), {}, "3.weight holds NaN"),
    (_arrays(9, **{"1.weight": np.zeros((5, 6))}), {}, "has shape (5, 6), sent (4, 6)"),
    (_arrays(9, **{"3.weight": None}), {}, "lacks ['3.weight']"),
    (_arrays(9, extra=np.zeros(3)), {}, "adds ['extra']"),
    (_arrays(9), {"examples": 0}, "num-examples=0"),
    (_arrays(9), {"examples": float("nan")}, "num-examples=nan"),
    (_arrays(9), {"loss": MetricRecord({NUM_EXAMPLES: 5})}, "MetricRecords"),
    (_arrays(9), {"more": ArrayRecord({"x": Array(np.zeros(2))})}, "ArrayRecords"),
    (_arrays(9), {"declared": {STATUS: "tired"}}, "declares status 'tired'"),
]


@pytest.mark.parametrize(("arrays", "extra", "problem"), GARBAGE)
def test_garbage_is_rejected_and_the_rest_aggregated_bit_for_bit(
    arrays: ArrayRecord | None, extra: dict[str, Any], problem: str
) -> None:
    seen: list[LeftOut] = []
    examples = extra.pop("examples", 10)
    declared = extra.pop("declared", None)
    bad = _reply(3, arrays, examples, declared, **extra)
    wrapped, _ = _tolerant(seen).aggregate_train(1, iter([*_good(), bad]))
    plain, _ = FedAvg().aggregate_train(1, _good())
    assert wrapped is not None and plain is not None
    assert all(np.array_equal(wrapped[k].numpy(), plain[k].numpy()) for k in plain)
    assert [(f.client, f.status) for f in seen] == [(2, REJECTED)]
    assert problem in seen[0].reason and seen[0].audit[SAMPLE_IDS] == [1, 2, 3]


def test_declared_failures_and_error_replies_are_left_out_with_their_reason() -> None:
    seen: list[LeftOut] = []
    strategy = _tolerant(seen)
    strategy.aggregate_train(1, [*_good(), _reply(3, _arrays(3))])  # node 3 is client 2
    diverged = _reply(
        3, None, 0, {STATUS: DIVERGED, REASON: "loss on its batch went from 2.3 to 1e25"}
    )
    failed = _reply(1, None, 0, {STATUS: CLIENT_ERROR, REASON: "RuntimeError: boom"})
    wrapped, _ = strategy.aggregate_train(2, [failed, _reply(2, _arrays(2)), diverged, _error(3)])
    plain, _ = FedAvg().aggregate_train(2, [_reply(2, _arrays(2))])
    assert wrapped is not None and plain is not None
    assert all(np.array_equal(wrapped[k].numpy(), plain[k].numpy()) for k in plain)
    assert [(f.server_round, f.client, f.status) for f in seen] == [
        (2, 0, CLIENT_ERROR),
        (2, 2, DIVERGED),
        (2, 2, CLIENT_ERROR),  # an error reply has no content: its client was learnt in round 1
    ]
    assert seen[0].reason == "RuntimeError: boom" and "1e25" in seen[1].reason
    assert "boom" in seen[2].reason and seen[2].declared == {}


def test_an_error_reply_from_a_node_never_heard_of_names_no_client() -> None:
    seen: list[LeftOut] = []
    _tolerant(seen).aggregate_train(1, [*_good(), _error(7)])
    assert [(f.node_id, f.client, f.status) for f in seen] == [(7, None, CLIENT_ERROR)]


class _Never(FedAvg):
    def aggregate_train(self, server_round: int, replies: Any) -> Any:
        raise AssertionError("asked to aggregate no reply")


def test_a_round_in_which_every_client_failed_keeps_the_model() -> None:
    seen: list[LeftOut] = []
    replies = [_error(1), _reply(2, None, 0, {STATUS: DIVERGED, REASON: "nan"})]
    assert _tolerant(seen, _Never()).aggregate_train(1, replies) == (None, None)
    assert [f.status for f in seen] == [CLIENT_ERROR, DIVERGED]


def test_a_failing_sink_never_stops_aggregation() -> None:
    def explode(fault: LeftOut) -> None:
        raise RuntimeError("recorder broke")

    strategy = FaultTolerant(FedAvg(), explode)
    strategy._sent = {k: v.shape for k, v in _numpy(0).items()}
    wrapped, _ = strategy.aggregate_train(1, [*_good(), _error(3)])
    assert wrapped is not None


def test_honest_but_curious_records_error_replies_and_declared_failures() -> None:
    """The reply that once stopped the run: Flower's error reply has no content to read."""
    seen: list[InterceptedUpdate] = []
    wrapper = HonestButCurious(FedAvg(), seen.append, LAYER, keep_whole=lambda r, d: True)
    start = _numpy(0)
    wrapper._sent = {1: (start["1.weight"], start["1.bias"])}
    wrapper._sent_all = {1: start}
    diverged = _reply(2, None, 0, {STATUS: DIVERGED, REASON: "training loss is nan"})
    wrapped, _ = wrapper.aggregate_train(1, [_reply(1, _arrays(1)), diverged, _error(3)])
    assert wrapped is not None
    assert [(u.problem is None, u.failure) for u in seen] == [
        (True, REJECTED),  # the default, unused for a usable update
        (False, DIVERGED),
        (False, CLIENT_ERROR),
    ]
    assert seen[1].problem == "training loss is nan" and seen[2].declared == {}
    assert wrapper.aggregate_train(1, [_error(3)]) == (None, None)
