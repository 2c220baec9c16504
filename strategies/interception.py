"""What the honest-but-curious server keeps of each client reply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message

from clients.reply import ARRAYS, AUDIT, CLIENT, REJECTED
from strategies.screening import declared_failure, record_of


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
        Why the reply cannot be attacked (missing arrays, wrong shapes, NaN, the client's own
        failure...), else ``None``.
    failure
        The audit status of a reply with a problem: ``rejected`` (unreadable), or the failure
        the client declared (``diverged``, ``client-error``).
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
    failure: str = REJECTED

    def received_layer(self) -> tuple[np.ndarray, np.ndarray]:
        """The attacked layer as the client returned it: (weight, bias).

        Raises
        ------
        ValueError
            For an update with a problem, of which nothing was kept.
        """
        if self.weight is None or self.bias is None:
            raise ValueError(
                f"round {self.server_round}, node {self.node_id}: the update has no layer "
                f"to use ({self.problem or 'none was kept'})"
            )
        return self.weight, self.bias

    def whole(self) -> tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]:
        """Every array as sent and as returned.

        Raises
        ------
        ValueError
            When the update was not kept whole.
        """
        if self.sent_arrays is None or self.arrays is None:
            raise ValueError(
                f"round {self.server_round}, node {self.node_id}: the update was not kept whole"
            )
        return self.sent_arrays, self.arrays


def declared(msg: Message) -> dict[str, Any]:
    """What the client declared of itself: its ``client`` ConfigRecord (empty for an error
    reply, which has no content)."""
    return record_of(msg, CLIENT)


def intercept(
    msg: Message,
    server_round: int,
    layer: tuple[str, str],
    sent: tuple[np.ndarray, np.ndarray],
    arrays_key: str = ARRAYS,
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
        "audit": record_of(msg, AUDIT),
    }
    failure = declared_failure(msg)
    if failure is not None:  # Flower's error reply, or a failure the client declared
        status, reason = failure
        return InterceptedUpdate(**base, weight=None, bias=None, problem=reason, failure=status)
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
