"""What a strategy that wraps a strategy passes on unchanged: evaluation."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy


class StrategyWrapper(Strategy):
    """Base of the wrappers (``FaultTolerant``, ``HonestButCurious``): they act on training
    and delegate evaluation to ``strategy``, the strategy they wrap."""

    strategy: Strategy

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Delegate."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Delegate (FedAvg leaves Flower's error replies out itself)."""
        return self.strategy.aggregate_evaluate(server_round, replies)
