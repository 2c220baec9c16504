"""Flower's rounds renumbered, for a federation that resumes after a round it completed."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.wrapper import StrategyWrapper


class RoundOffset(StrategyWrapper):
    """``strategy`` told round ``offset + r`` where Flower's loop is at round ``r``: a federation
    resumed after round ``offset`` runs Flower's rounds 1, 2, ... as its rounds ``offset + 1``,
    ``offset + 2``, ..., so the clients' per-round seeds, the audit's records and the server's
    behaviours see the round numbers of an uninterrupted run.

    Parameters
    ----------
    strategy
        The strategy that runs the federation (every wrapper inside this one).
    offset
        The last round completed before the resume.
    """

    def __init__(self, strategy: Strategy, offset: int) -> None:
        self.strategy = strategy
        self.offset = offset

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Delegate, at the resumed round."""
        return self.strategy.configure_train(server_round + self.offset, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Delegate, at the resumed round."""
        return self.strategy.aggregate_train(server_round + self.offset, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Delegate, at the resumed round."""
        return self.strategy.configure_evaluate(server_round + self.offset, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Delegate, at the resumed round."""
        return self.strategy.aggregate_evaluate(server_round + self.offset, replies)

    def summary(self) -> None:
        """Delegate."""
        self.strategy.summary()
