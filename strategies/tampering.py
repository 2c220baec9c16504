"""The dishonest server's wrapper: it sends a tampered first layer for training and still keeps
the global model honest."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.behaviours import BEHAVIOURS, BehaviourSettings
from strategies.wrapper import StrategyWrapper

log = logging.getLogger(__name__)


class Tampering(StrategyWrapper):
    """Wrap ``strategy``: each round's first layer replaced by what the behaviour sends, each
    aggregate moved back onto the honest model.

    Parameters
    ----------
    strategy
        A strategy that aggregates as a weighted mean (FedAvg), possibly wrapped by
        :class:`strategies.HonestButCurious`, which then sees the tampered arrays as the ones
        sent, as its attacks must.
    settings
        The behaviour's settings; their name picks the registered behaviour.
    layer
        ArrayRecord keys of the first linear layer's weight and bias.
    public
        Inputs the server holds itself (N x n, as the first layer takes them), for the
        behaviour's statistics.
    seed
        Seeds the behaviour's randomness, round by round.

    Notes
    -----
    Clients train from the tampered model, so the wrapped strategy's weighted mean of their
    replies is tampered + mean update; adding (honest - tampered) gives honest + mean update,
    the global model a server that keeps its own model honest and only lies to the clients
    holds. What that costs is the updates' being computed at the wrong model: the global
    model's test accuracy against the honest run's.
    """

    def __init__(
        self,
        strategy: Strategy,
        settings: BehaviourSettings,
        layer: tuple[str, str],
        public: np.ndarray,
        seed: int,
    ) -> None:
        self.strategy = strategy
        self.settings = settings
        self.behaviour = BEHAVIOURS[settings.behaviour]
        self.layer = layer
        self.public = public
        self.seed = seed
        self._shift: dict[int, dict[str, np.ndarray]] = {}

    def tampered(self, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        """``arrays`` with the first layer the behaviour sends in this round."""
        w_key, b_key = self.layer
        weight, bias = arrays[w_key].numpy(), arrays[b_key].numpy()
        rng = np.random.default_rng([self.seed, server_round])
        new_weight, new_bias = self.behaviour.first_layer(
            weight, bias, self.public, self.settings, rng
        )
        out = ArrayRecord({k: arrays[k] for k in arrays})
        out[w_key], out[b_key] = Array(new_weight), Array(new_bias)
        return out

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the tampered arrays; remember how far they are from the honest ones."""
        sent = self.tampered(server_round, arrays)
        self._shift = {server_round: {k: arrays[k].numpy() - sent[k].numpy() for k in self.layer}}
        return self.strategy.configure_train(server_round, sent, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's aggregate moved back by (honest - tampered)."""
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        shift = self._shift[server_round]
        moved = ArrayRecord({k: arrays[k] for k in arrays})
        for key, delta in shift.items():
            moved[key] = Array(arrays[key].numpy() + delta)
        return moved, metrics

    def summary(self) -> None:
        """Delegate, saying what is sent."""
        log.info("Tampering (%s): sends %s", self.behaviour.name, self.behaviour.sends)
        self.strategy.summary()
