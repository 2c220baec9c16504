"""The dishonest server under SecAgg+: the legacy strategy's instructions tampered with, one
model per client where the behaviour sends several, the global model still aggregated
honestly."""

from __future__ import annotations

import logging

import numpy as np
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
from strategies.behaviours import BEHAVIOURS, BehaviourSettings
from strategies.legacy_wrapper import LegacyWrapper

log = logging.getLogger(__name__)


class LegacyTampering(LegacyWrapper):
    """Wrap a legacy ``flwr.server.strategy`` strategy (FedAvg, driven by Flower's
    ``SecAggPlusWorkflow``): each client proxy's ``FitIns`` carry the first layer the behaviour
    sends that client, each aggregate is moved back onto the honest model.

    Parameters
    ----------
    strategy
        The legacy strategy; it aggregates as a weighted mean by ``num_examples``, as SecAgg+
        does.
    settings
        The behaviour's settings; their name picks the registered behaviour.
    layer
        Positions of the first linear layer's weight and bias in the legacy parameter list.
    public
        Inputs the server holds itself (N x n), for the behaviour's statistics.
    seed
        Seeds the behaviour's randomness, round by round (as :class:`strategies.Tampering`).

    Notes
    -----
    The behaviour learns which client a node is from what the node declares in the clear with
    each result (its partition id, in the fit metrics SecAgg+ leaves unmasked); a node not yet
    seen is ``None`` to it. The sum SecAgg+ unmasks is the weighted mean of what each client
    was sent plus the mean update; adding (honest - the weighted mean of what was sent) gives
    the honest model plus the mean update.
    """

    def __init__(
        self,
        strategy: Strategy,
        settings: BehaviourSettings,
        layer: tuple[int, int],
        public: np.ndarray,
        seed: int,
    ) -> None:
        super().__init__(strategy)
        self.settings = settings
        self.behaviour = BEHAVIOURS[settings.behaviour]
        self.layer = layer
        self.public = public
        self.seed = seed
        self.client_of: dict[int, int] = {}
        self._honest: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._sent: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {}

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The wrapped strategy's instructions, each with the first layer its client is sent."""
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        w, b = self.layer
        arrays = parameters_to_ndarrays(parameters)
        clients = [self.client_of.get(proxy.node_id) for proxy, _ in instructions]
        rng = np.random.default_rng([self.seed, server_round])
        layers = self.behaviour.layers(
            clients, arrays[w], arrays[b], self.public, self.settings, rng
        )
        self._honest = {server_round: (arrays[w], arrays[b])}
        self._sent = {server_round: {}}
        tampered = []
        for (proxy, fitins), (weight, bias) in zip(instructions, layers, strict=True):
            sent = list(parameters_to_ndarrays(fitins.parameters))
            sent[w], sent[b] = weight.astype(sent[w].dtype), bias.astype(sent[b].dtype)
            self._sent[server_round][proxy.node_id] = (sent[w], sent[b])
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
            client = res.metrics.get(PARTITION_ID)
            if isinstance(client, int):
                self.client_of[proxy.node_id] = client
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        if parameters is None or not results:
            return parameters, metrics
        sent = self._sent[server_round]
        total = sum(res.num_examples for _, res in results)
        arrays = list(parameters_to_ndarrays(parameters))
        for i, position in enumerate(self.layer):
            mean = sum(
                res.num_examples * sent[proxy.node_id][i].astype(np.float64)
                for proxy, res in results
            )
            shift = self._honest[server_round][i].astype(np.float64) - mean / total
            arrays[position] = (arrays[position] + shift).astype(arrays[position].dtype)
        return ndarrays_to_parameters(arrays), metrics
