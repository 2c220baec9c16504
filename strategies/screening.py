"""Which client replies the server can aggregate, and why the others cannot.

A server cannot trust its clients: a reply may carry Flower's error (the ClientApp raised), a
failure the client declared itself (its training diverged), or content that would stop the
aggregation or poison the global model (no arrays, other keys or shapes than were sent, NaN,
no positive ``num-examples``). Each is named here so that it can be recorded and left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message

from clients.reply import (
    ARRAYS,
    CLIENT,
    CLIENT_ERROR,
    DIVERGED,
    METRICS,
    NUM_EXAMPLES,
    OK,
    REASON,
    REJECTED,
    STATUS,
)

# Array keys of the global model as sent this round, with their shapes.
SentShapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class LeftOut:
    """A reply the server left out of aggregation.

    Attributes
    ----------
    server_round, node_id
        When and from whom.
    client
        The client's partition id: declared in the reply, else learnt from an earlier reply of
        the same node; ``None`` when neither says (a Flower error reply carries no content).
    status
        ``diverged`` or ``client-error`` (the client's failure), or ``rejected`` (the server's
        verdict on a reply it cannot use).
    reason
        Why, in words.
    declared
        The client's ``client`` ConfigRecord, if any (its settings, status, reason).
    audit
        The client's ``audit`` record, if any (simulation only: the samples it drew).
    """

    server_round: int
    node_id: int
    client: int | None
    status: str
    reason: str
    declared: Mapping[str, Any] = field(default_factory=dict)
    audit: Mapping[str, Any] = field(default_factory=dict)


def record_of(msg: Message, key: str) -> dict[str, Any]:
    """The reply's ConfigRecord ``key`` as a dict (empty when absent, also for an error reply,
    which has no content at all)."""
    if not msg.has_content():
        return {}
    rec = msg.content.get(key)
    return dict(rec) if isinstance(rec, ConfigRecord) else {}


def declared_failure(msg: Message) -> tuple[str, str] | None:
    """(status, reason) of a reply that says it failed: Flower's error reply, or a status other
    than ``ok`` in the client's ConfigRecord; ``None`` for any other reply."""
    if msg.has_error():
        error = msg.error
        return CLIENT_ERROR, f"the ClientApp raised (Flower error {error.code}): {error.reason}"
    if not msg.has_content():
        return REJECTED, "reply has neither content nor an error"
    declared = record_of(msg, CLIENT)
    status = declared.get(STATUS, OK)
    if status == OK:
        return None
    reason = str(declared.get(REASON) or "no reason given")
    if status in (DIVERGED, CLIENT_ERROR):
        return str(status), reason
    return REJECTED, f"client declares status {status!r}: {reason}"


def _finite(value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values)


def unusable(msg: Message, sent: SentShapes) -> str | None:
    """Why a reply with content cannot be aggregated with the global model as sent (its arrays
    ``sent``), or ``None`` when it can: exactly one ArrayRecord ``arrays`` with the keys and
    shapes sent and only finite values, and one MetricRecord ``metrics`` with finite values and
    ``num-examples`` > 0 (FedAvg's weight; it refuses anything else and stops the run)."""
    content = msg.content
    if list(content.array_records) != [ARRAYS]:
        return f"reply holds ArrayRecords {sorted(content.array_records)}, not one {ARRAYS!r}"
    if list(content.metric_records) != [METRICS]:
        return f"reply holds MetricRecords {sorted(content.metric_records)}, not one {METRICS!r}"
    metrics = content.metric_records[METRICS]
    examples = metrics.get(NUM_EXAMPLES)
    if not (isinstance(examples, int | float) and math.isfinite(examples) and examples > 0):
        return f"{NUM_EXAMPLES}={examples!r}: must be a number > 0"
    bad = sorted(k for k, v in metrics.items() if not _finite(v))
    if bad:
        return f"metrics {bad} hold NaN or infinite values"
    arrays = content.array_records[ARRAYS]
    missing = sorted(set(sent) - set(arrays))
    extra = sorted(set(arrays) - set(sent))
    if missing or extra:
        return f"reply's arrays differ from those sent: lacks {missing}, adds {extra}"
    for key, shape in sent.items():
        got = tuple(arrays[key].shape)
        if got != shape:
            return f"{key} has shape {got}, sent {shape}"
        try:
            finite = bool(np.isfinite(arrays[key].numpy()).all())
        except (TypeError, ValueError) as err:  # not numbers, or bytes that do not decode
            return f"{key} cannot be read as numbers: {err}"
        if not finite:
            return f"{key} holds NaN or infinite values"
    return None


def screen(msg: Message, sent: SentShapes) -> tuple[str, str] | None:
    """(status, reason) when ``msg`` must be left out of aggregation, else ``None``."""
    failure = declared_failure(msg)
    if failure is not None:
        return failure
    problem = unusable(msg, sent)
    return (REJECTED, problem) if problem is not None else None
