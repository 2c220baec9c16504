"""A federation that survives its clients: every reply screened before aggregation."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from clients.reply import AUDIT, CLIENT, PARTITION_ID
from strategies.core import Partitions
from strategies.screening import LeftOut, SentShapes, record_of, screen
from strategies.wrapper import StrategyWrapper

log = logging.getLogger(__name__)

FaultSink = Callable[[LeftOut], None]


class FaultTolerant(StrategyWrapper):
    """Wrap ``strategy`` so that no client can stop the run or poison the global model.

    Every training reply is screened (:func:`strategies.screening.screen`): Flower's error
    replies, replies whose client declares a failure (``diverged``, ``client-error``) and
    replies that cannot be aggregated (``rejected``) are handed to ``sink`` and left out; the
    others reach the wrapped strategy untouched. A round in which no reply is left keeps the
    global model as it was (the wrapped strategy is not asked to aggregate nothing) and the
    run goes on.

    Parameters
    ----------
    strategy
        Any ``flwr.serverapp.strategy`` strategy (here FedAvg, or the honest-but-curious wrapper
        around it).
    sink
        Receives each reply left out; an exception in it is logged and never reaches the
        federation.
    partitions
        Which client each node is, learnt from every reply that says: Flower's error replies
        carry no content, so this is how one of them is attributed to its client (shared with
        the rest of the server; default: its own).
    """

    def __init__(
        self,
        strategy: Strategy,
        sink: FaultSink | None = None,
        partitions: Partitions | None = None,
    ) -> None:
        self.strategy = strategy
        self.sink = sink
        self._sent: SentShapes = {}
        self.partitions = partitions or Partitions()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember the keys and shapes of the arrays sent, then delegate."""
        self._sent = {k: tuple(arrays[k].shape) for k in arrays}
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Leave out (and report) every reply that cannot be aggregated, aggregate the rest; with
        none left, ``(None, None)``: the global model stays as it was."""
        replies = list(replies)  # an iterable: read once
        keep = []
        for msg in replies:
            node = int(msg.metadata.src_node_id)
            declared = record_of(msg, CLIENT)
            self.partitions.learn(node, declared.get(PARTITION_ID))
            found = screen(msg, self._sent)
            if found is None:
                keep.append(msg)
                continue
            status, reason = found
            fault = LeftOut(
                server_round=server_round,
                node_id=node,
                client=self.partitions.of(node),
                status=status,
                reason=reason,
                declared=declared,
                audit=record_of(msg, AUDIT),
            )
            log.warning(
                "round %d: client %s (node %d) left out of aggregation: %s: %s",
                server_round,
                "?" if fault.client is None else fault.client,
                node,
                status,
                reason,
            )
            if self.sink is not None:
                try:
                    self.sink(fault)
                except Exception:  # recording a fault must not become one
                    log.exception("recording the fault of node %d failed", node)
        if not keep:
            log.warning(
                "round %d: none of %d replies could be aggregated: the global model stays as it "
                "was",
                server_round,
                len(replies),
            )
            return None, None
        return self.strategy.aggregate_train(server_round, keep)

    def summary(self) -> None:
        """Delegate, saying that replies are screened."""
        log.info("FaultTolerant: every reply screened before aggregation")
        self.strategy.summary()
