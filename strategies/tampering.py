"""The dishonest server under Flower's Message API: each client's message carries the first
layer the behaviour sends it, and the global model is still aggregated honestly."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from clients.reply import ARRAYS, CLIENT, METRICS, NUM_EXAMPLES, PARTITION_ID
from strategies.core import ServerCore, same_layer
from strategies.screening import record_of
from strategies.wrapper import StrategyWrapper

log = logging.getLogger(__name__)


class Tampering(StrategyWrapper):
    """Wrap ``strategy``: each round's first layer replaced, per client, by what ``core``'s
    behaviour sends; each aggregate moved back onto the honest model.

    Parameters
    ----------
    strategy
        A strategy that aggregates as a weighted mean by ``num-examples`` (FedAvg, possibly
        inside Flower's central DP wrapper, which then clips against the tampered layer, the
        one the clients trained from).
    core
        The server behaviour and what it sent (:class:`strategies.core.ServerCore`); an
        honest-but-curious wrapper outside this one sets each reply against what the core says
        its node was sent.
    layer
        ArrayRecord keys of the first linear layer's weight and bias.

    Notes
    -----
    The wrapped strategy is handed the arrays with the layer most nodes get (the one sent to
    every node, when the behaviour sends one model), and each message whose node gets another
    one carries its own. Clients train from what they were sent, so the weighted mean of their
    replies is (the weighted mean of what was sent) + the mean update; adding honest minus the
    former gives the honest model plus the mean update. What the tampering costs is the
    updates' being computed at the wrong model: the global model's test accuracy against the
    honest run's.
    """

    def __init__(self, strategy: Strategy, core: ServerCore, layer: tuple[str, str]) -> None:
        self.strategy = strategy
        self.core = core
        self.layer = layer

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send each node the layer the behaviour gives it."""
        w_key, b_key = self.layer
        nodes = sorted(grid.get_node_ids())
        self.core.send(server_round, nodes, arrays[w_key].numpy(), arrays[b_key].numpy())
        common = self.core.uniform(server_round) or self.core.sent_to(server_round, None)
        messages = list(
            self.strategy.configure_train(
                server_round, _with(arrays, self.layer, common), config, grid
            )
        )
        for msg in messages:
            own = self.core.sent_to(server_round, int(msg.metadata.dst_node_id))
            if not same_layer(own, common):
                content = RecordDict(dict(msg.content.items()))
                content[ARRAYS] = _with(msg.content.array_records[ARRAYS], self.layer, own)
                msg.content = content
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregate moved back by (honest - the weighted mean of what
        the summed clients were sent)."""
        replies = list(replies)
        for msg in replies:
            node = int(msg.metadata.src_node_id)
            self.core.partitions.learn(node, record_of(msg, CLIENT).get(PARTITION_ID))
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        weights = [(int(m.metadata.src_node_id), _examples(m)) for m in replies if m.has_content()]
        shift = self.core.honest_shift(server_round, weights)
        moved = ArrayRecord({k: arrays[k] for k in arrays})
        for key, delta in zip(self.layer, shift, strict=True):
            value = arrays[key].numpy()
            moved[key] = Array((value.astype(np.float64) + delta).astype(value.dtype))
        return moved, metrics

    def summary(self) -> None:
        """Delegate, saying what is sent."""
        log.info("Tampering (%s): sends %s", self.core.behaviour.name, self.core.behaviour.sends)
        self.strategy.summary()


def _with(
    arrays: ArrayRecord, layer: tuple[str, str], sent: tuple[np.ndarray, np.ndarray]
) -> ArrayRecord:
    out = ArrayRecord({k: arrays[k] for k in arrays})
    for key, value in zip(layer, sent, strict=True):
        out[key] = Array(value)
    return out


def _examples(msg: Message) -> float:
    # FedAvg's weight of a reply (strategies.screening leaves out any reply without a
    # positive one).
    value = msg.content.metric_records[METRICS][NUM_EXAMPLES]
    if not isinstance(value, int | float):
        raise TypeError(f"{NUM_EXAMPLES} = {value!r}: a number is needed")
    return float(value)
