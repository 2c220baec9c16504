"""The honest-but-curious server: aggregates exactly as the strategy it wraps, and hands every
client update to an attack on the side."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.core import ServerCore
from strategies.interception import InterceptedUpdate, declared, intercept
from strategies.wrapper import StrategyWrapper

log = logging.getLogger(__name__)

UpdateSink = Callable[[InterceptedUpdate], None]
# (round, what the client declared) -> keep every array of its update, not only the layer's.
KeepWhole = Callable[[int, Mapping[str, Any]], bool]


class HonestButCurious(StrategyWrapper):
    """Wrap ``strategy``: same messages out, same aggregation in, every reply seen first.

    Like Flower's DP wrappers it remembers the global arrays in :meth:`configure_train`, reads
    the replies in :meth:`aggregate_train`, and delegates everything else.

    Parameters
    ----------
    strategy
        Any ``flwr.serverapp.strategy`` strategy.
    sink
        Receives each reply reduced to the attacked layer; it must return quickly (attacks run
        elsewhere). An exception in it is logged and never reaches the federation.
    layer
        ArrayRecord keys of the attacked layer's weight and bias (e.g. ``("1.weight",
        "1.bias")``).
    attack_round
        Which rounds to intercept (default: all).
    keep_whole
        Which replies to hand over whole (every array as sent and returned): those a
        whole-model attack targets. Default: none, only the layer.
    core
        Where the server sends each client its own layer (:class:`strategies.Tampering`,
        inside this wrapper): each reply is set against what the core says its node was sent.
        Default: every node was sent the arrays this wrapper passes on.

    Notes
    -----
    A reply that cannot be read (Flower's error reply, a failure the client declared, no
    arrays, wrong shapes, NaN) is reported to the sink and left out of aggregation, where it
    would otherwise stop the run or poison the model; all other replies reach the wrapped
    strategy untouched, and a round with none of them keeps the global model as it was.
    """

    def __init__(
        self,
        strategy: Strategy,
        sink: UpdateSink,
        layer: tuple[str, str],
        attack_round: Callable[[int], bool] = lambda r: True,
        keep_whole: KeepWhole | None = None,
        core: ServerCore | None = None,
    ) -> None:
        self.strategy = strategy
        self.sink = sink
        self.layer = layer
        self.attack_round = attack_round
        self.keep_whole = keep_whole
        self.core = core
        self._sent: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._sent_all: dict[int, dict[str, np.ndarray]] = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember the attacked layer (every array, if any reply may be kept whole) as sent,
        then delegate."""
        w_key, b_key = self.layer
        self._sent = {server_round: (arrays[w_key].numpy().copy(), arrays[b_key].numpy().copy())}
        if self.keep_whole is not None:
            self._sent_all = {server_round: {k: arrays[k].numpy().copy() for k in arrays}}
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Hand each reply to the sink, then aggregate the readable ones as the wrapped does."""
        replies = list(replies)
        keep = []
        for msg in replies:
            whole = self.keep_whole is not None and self.keep_whole(server_round, declared(msg))
            sent = self._sent[server_round]
            sent_all = self._sent_all.get(server_round) if whole else None
            if self.core is not None:
                sent = self.core.sent_to(server_round, int(msg.metadata.src_node_id))
                if sent_all is not None:
                    sent_all = {**sent_all, **dict(zip(self.layer, sent, strict=True))}
            update = intercept(msg, server_round, self.layer, sent, sent_all=sent_all)
            if update.problem is None:
                keep.append(msg)
            else:
                log.warning(
                    "round %d: reply from node %d left out of aggregation: %s",
                    server_round,
                    update.node_id,
                    update.problem,
                )
            if self.attack_round(server_round) or update.problem:
                try:
                    self.sink(update)
                except Exception:  # the federation goes on whatever the attack side does
                    log.exception("the update sink failed on round %d", server_round)
        if not keep:  # every client failed: the global model stays, the run goes on
            return None, None
        return self.strategy.aggregate_train(server_round, keep)

    def summary(self) -> None:
        """Delegate, saying that replies are intercepted."""
        log.info("HonestButCurious: intercepting layer %s of every reply", self.layer)
        self.strategy.summary()
