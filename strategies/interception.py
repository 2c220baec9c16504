"""What the honest-but-curious server keeps of each client reply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message


@dataclass(frozen=True)
class InterceptedUpdate:
    """One client's reply as the server sees it, reduced to the attacked layer, or whole where
    a whole-model attack (or the judge's proxies) needs every array.

    Attributes
    ----------
    server_round, node_id
        When and from whom.
    declared
        The client's own ConfigRecord ``client`` (defence, lr, batch size, epsilon...).
    sent_weight, sent_bias
        The layer as the server sent it this round.
    weight, bias
        The layer as the client returned it (``None`` when the reply is unusable).
    audit
        Simulation-only references to ground truth (the ``audit`` record: sample ids). Only the
        judge reads it; it is never handed to an attack.
    problem
        Why the reply cannot be attacked (missing arrays, wrong shapes, NaN...), else ``None``.
    sent_arrays, arrays
        Every array as sent and as returned, when the update is kept whole (else ``None``).
    """

    server_round: int
    node_id: int
    declared: Mapping[str, Any]
    sent_weight: np.ndarray
    sent_bias: np.ndarray
    weight: np.ndarray | None
    bias: np.ndarray | None
    audit: Mapping[str, Any] = field(default_factory=dict)
    problem: str | None = None
    sent_arrays: Mapping[str, np.ndarray] | None = None
    arrays: Mapping[str, np.ndarray] | None = None


def declared(msg: Message) -> dict[str, Any]:
    """What the client declared of itself: its ``client`` ConfigRecord."""
    return _record(msg, "client")


def _record(msg: Message, key: str) -> dict[str, Any]:
    rec = msg.content.get(key)
    return dict(rec) if isinstance(rec, ConfigRecord) else {}


def intercept(
    msg: Message,
    server_round: int,
    layer: tuple[str, str],
    sent: tuple[np.ndarray, np.ndarray],
    arrays_key: str = "arrays",
    sent_all: Mapping[str, np.ndarray] | None = None,
) -> InterceptedUpdate:
    """Reduce a reply to the attacked layer, naming what is wrong with it if anything is.

    With ``sent_all`` (every array as sent) the reply is kept whole, and every array checked.
    """
    w_key, b_key = layer
    base: dict[str, Any] = {
        "server_round": server_round,
        "node_id": int(msg.metadata.src_node_id),
        "declared": declared(msg),
        "sent_weight": sent[0],
        "sent_bias": sent[1],
        "audit": _record(msg, "audit"),
    }
    if msg.has_error():
        return InterceptedUpdate(
            **base, weight=None, bias=None, problem=f"client error: {msg.error.reason}"
        )
    arrays = msg.content.get(arrays_key)
    if not isinstance(arrays, ArrayRecord):
        return InterceptedUpdate(
            **base, weight=None, bias=None, problem=f"reply has no ArrayRecord {arrays_key!r}"
        )
    missing = [k for k in layer if k not in arrays]
    if missing:
        return InterceptedUpdate(
            **base, weight=None, bias=None, problem=f"reply lacks arrays {missing}"
        )
    weight, bias = arrays[w_key].numpy(), arrays[b_key].numpy()
    checks = [(w_key, weight, sent[0]), (b_key, bias, sent[1])]
    whole = None
    if sent_all is not None:
        missing = [k for k in sent_all if k not in arrays]
        if missing:
            return InterceptedUpdate(
                **base, weight=None, bias=None, problem=f"reply lacks arrays {missing}"
            )
        whole = {k: arrays[k].numpy() for k in sent_all}
        checks = [(k, whole[k], sent_all[k]) for k in sent_all]
    for name, got, want in checks:
        if got.shape != want.shape:
            return InterceptedUpdate(
                **base,
                weight=None,
                bias=None,
                problem=f"{name} has shape {got.shape}, sent {want.shape}",
            )
        if not np.isfinite(got).all():
            return InterceptedUpdate(
                **base, weight=None, bias=None, problem=f"{name} holds NaN or infinite values"
            )
    return InterceptedUpdate(**base, weight=weight, bias=bias, sent_arrays=sent_all, arrays=whole)
