"""The honest-but-curious wrapper: same aggregation, every reply seen, bad replies recorded."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from strategies import HonestButCurious, InterceptedUpdate

LAYER = ("1.weight", "1.bias")


@pytest.fixture(autouse=True)
def _identity() -> Iterator[None]:
    """Messages made outside a running app need an identity; restored afterwards."""
    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before


def _arrays(seed: int, nan: bool = False, shape: tuple[int, int] = (4, 6)) -> ArrayRecord:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape)
    if nan:
        w[0, 0] = np.nan
    arrays = {
        "1.weight": w,
        "1.bias": rng.standard_normal(shape[0]),
        "3.weight": rng.standard_normal((2, 4)),
    }
    return ArrayRecord({k: Array(v) for k, v in arrays.items()})


def _reply(node: int, arrays: ArrayRecord | None, examples: int) -> Message:
    sent = Message(RecordDict({}), dst_node_id=node, message_type=MessageType.TRAIN)
    content = RecordDict(
        {
            "metrics": MetricRecord({"num-examples": examples}),
            "client": ConfigRecord({"partition-id": node - 1}),
        }
    )
    if arrays is not None:
        content["arrays"] = arrays
    return Message(content, reply_to=sent)


def _wrapped(sink: object) -> HonestButCurious:
    wrapper = HonestButCurious(FedAvg(), sink, LAYER)  # type: ignore[arg-type]
    start = _arrays(0)
    wrapper._sent = {1: (start["1.weight"].numpy(), start["1.bias"].numpy())}
    return wrapper


def test_aggregation_is_bit_for_bit_the_wrapped_one() -> None:
    replies = [_reply(i + 1, _arrays(i + 1), 10 + i) for i in range(3)]
    seen: list[InterceptedUpdate] = []
    plain, _ = FedAvg().aggregate_train(1, replies)
    wrapped, _ = _wrapped(seen.append).aggregate_train(1, iter(replies))
    assert plain is not None and wrapped is not None
    for key in plain:
        assert np.array_equal(plain[key].numpy(), wrapped[key].numpy())
    assert [u.node_id for u in seen] == [1, 2, 3]
    assert all(u.problem is None and u.weight is not None for u in seen)


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (None, "no ArrayRecord"),
        (_arrays(9, nan=True), "NaN"),
        (_arrays(9, shape=(5, 6)), "has shape"),
        (ArrayRecord({"3.weight": Array(np.zeros((2, 4)))}), "lacks arrays"),
    ],
)
def test_corrupted_reply_is_recorded_and_left_out(bad: ArrayRecord | None, problem: str) -> None:
    good = [_reply(1, _arrays(1), 10), _reply(2, _arrays(2), 10)]
    seen: list[InterceptedUpdate] = []
    wrapped, _ = _wrapped(seen.append).aggregate_train(1, [*good, _reply(3, bad, 10)])
    plain, _ = FedAvg().aggregate_train(1, good)
    assert wrapped is not None and plain is not None
    assert np.array_equal(wrapped["1.weight"].numpy(), plain["1.weight"].numpy())
    assert seen[2].problem is not None and problem in seen[2].problem


def test_a_failing_sink_never_stops_aggregation() -> None:
    def explode(update: InterceptedUpdate) -> None:
        raise RuntimeError("attack side broke")

    wrapped, _ = _wrapped(explode).aggregate_train(1, [_reply(1, _arrays(1), 5)])
    assert wrapped is not None


def test_replies_a_whole_model_attack_targets_are_kept_whole() -> None:
    seen: list[InterceptedUpdate] = []
    wrapper = HonestButCurious(
        FedAvg(), seen.append, LAYER, keep_whole=lambda r, declared: declared["partition-id"] == 1
    )
    start = _arrays(0)
    wrapper._sent = {1: (start["1.weight"].numpy(), start["1.bias"].numpy())}
    wrapper._sent_all = {1: {k: start[k].numpy() for k in start}}
    poisoned = _arrays(3)  # client 2, not kept whole: its NaN outside the layer goes unseen
    poisoned["3.weight"] = Array(np.full((2, 4), np.nan))
    replies = [_reply(1, _arrays(1), 10), _reply(2, _arrays(2), 10), _reply(3, poisoned, 10)]
    wrapper.aggregate_train(1, replies)
    assert seen[0].arrays is None and seen[0].sent_arrays is None  # client 0: the layer only
    assert seen[1].arrays is not None and set(seen[1].arrays) == {"1.weight", "1.bias", "3.weight"}
    assert seen[1].sent_arrays is not None and np.array_equal(
        seen[1].sent_arrays["3.weight"], start["3.weight"].numpy()
    )
    assert seen[2].problem is None  # client 2 is not kept whole: only its layer is checked
    seen.clear()
    wrapper.aggregate_train(1, [_reply(2, poisoned, 10)])  # client 1 kept whole: checked whole
    assert seen[0].problem is not None and "3.weight holds NaN" in seen[0].problem
