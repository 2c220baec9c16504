"""The base of fl-sim's wrappers of a legacy ``flwr.server.strategy`` strategy (the kind
Flower's ``SecAggPlusWorkflow`` drives): every call delegated, so a wrapper overrides only what
it changes."""

from __future__ import annotations

from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy


class LegacyWrapper(Strategy):
    """A legacy strategy that does what ``strategy`` does.

    Parameters
    ----------
    strategy
        The wrapped legacy strategy (e.g. ``flwr.server.strategy.FedAvg``).
    """

    def __init__(self, strategy: Strategy) -> None:
        super().__init__()
        self.strategy = strategy

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Delegate."""
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Delegate."""
        return self.strategy.configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Delegate."""
        return self.strategy.aggregate_fit(server_round, results, failures)

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Delegate."""
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """Delegate."""
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """Delegate (the central test of the global model)."""
        return self.strategy.evaluate(server_round, parameters)
