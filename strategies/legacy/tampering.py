"""The dishonest server under SecAgg+: the legacy strategy's instructions tampered with, one
model per client where the behaviour sends several, the global model still aggregated
honestly."""

from __future__ import annotations

from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from clients.reply import PARTITION_ID
from strategies.core import ServerCore
from strategies.legacy.wrapper import LegacyWrapper


class LegacyTampering(LegacyWrapper):
    """Wrap a legacy ``flwr.server.strategy`` strategy (FedAvg, driven by Flower's
    ``SecAggPlusWorkflow``): each client proxy's ``FitIns`` carry the first layer ``core``'s
    behaviour sends that client, each aggregate is moved back onto the honest model.

    Parameters
    ----------
    strategy
        The legacy strategy; it aggregates as a weighted mean by ``num_examples``, as SecAgg+
        does.
    core
        The server behaviour and what it sent (:class:`strategies.core.ServerCore`).
    layer
        Positions of the first linear layer's weight and bias in the legacy parameter list.

    Notes
    -----
    The core learns which client a node is from what the node declares in the clear with each
    result (its partition id, in the fit metrics SecAgg+ leaves unmasked). The sum SecAgg+
    unmasks is the weighted mean of what each client was sent plus the mean update; adding
    (honest - the weighted mean of what was sent) gives the honest model plus the mean update.
    """

    def __init__(self, strategy: Strategy, core: ServerCore, layer: tuple[int, int]) -> None:
        super().__init__(strategy)
        self.core = core
        self.layer = layer

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The wrapped strategy's instructions, each with the first layer its client is sent."""
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        w, b = self.layer
        arrays = parameters_to_ndarrays(parameters)
        self.core.send(
            server_round, [proxy.node_id for proxy, _ in instructions], arrays[w], arrays[b]
        )
        tampered = []
        for proxy, fitins in instructions:
            sent = list(parameters_to_ndarrays(fitins.parameters))
            sent[w], sent[b] = self.core.sent_to(server_round, proxy.node_id)
            tampered.append((proxy, FitIns(ndarrays_to_parameters(sent), fitins.config)))
        return tampered

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Learn who each summed node is; the wrapped aggregate moved back by (honest - the
        weighted mean of what the summed clients were sent)."""
        for proxy, res in results:
            self.core.partitions.learn(proxy.node_id, res.metrics.get(PARTITION_ID))
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        if parameters is None or not results:
            return parameters, metrics
        weights = [(proxy.node_id, float(res.num_examples)) for proxy, res in results]
        shift = self.core.honest_shift(server_round, weights)
        arrays = list(parameters_to_ndarrays(parameters))
        for position, delta in zip(self.layer, shift, strict=True):
            arrays[position] = (arrays[position] + delta).astype(arrays[position].dtype)
        return ndarrays_to_parameters(arrays), metrics
