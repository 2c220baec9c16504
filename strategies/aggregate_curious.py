"""The honest-but-curious server under secure aggregation: it sees only the sum, and attacks it.

Flower's ``SecAggPlusWorkflow`` unmasks the cohort's quantised sum and hands it to the legacy
strategy's ``aggregate_fit`` as every client's ``FitRes.parameters`` (the same weighted average
in each): that call is the one place the server holds anything of the clients' updates. What
it is set against is what each summed client was sent, weighted as in the sum: one model for
all from an honest server, one per client from a dishonest one
(:class:`strategies.LegacyTampering`, inside this wrapper).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from strategies.intercepted_aggregate import InterceptedAggregate
from strategies.legacy_wrapper import LegacyWrapper

log = logging.getLogger(__name__)

AggregateSink = Callable[[InterceptedAggregate], None]


class AggregateCurious(LegacyWrapper):
    """Wrap a legacy ``flwr.server.strategy`` strategy: same instructions out, same aggregate
    in, the unmasked sum seen first.

    Parameters
    ----------
    strategy
        The legacy strategy SecAgg+'s workflow drives (e.g. ``flwr.server.strategy.FedAvg``).
    sink
        Receives each round's aggregate reduced to the attacked layer; it must return quickly.
        An exception in it is logged and never reaches the federation.
    layer
        Positions of the attacked layer's weight and bias in the legacy parameter list.
    """

    def __init__(self, strategy: Strategy, sink: AggregateSink, layer: tuple[int, int]) -> None:
        super().__init__(strategy)
        self.sink = sink
        self.layer = layer
        self._sent: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {}

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Delegate, then remember the attacked layer each client was sent (a dishonest
        strategy inside may send each its own) and who was sampled."""
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        w, b = self.layer
        sent = {}
        for proxy, fitins in instructions:
            arrays = parameters_to_ndarrays(fitins.parameters)
            sent[proxy.node_id] = (arrays[w], arrays[b])
        self._sent = {server_round: sent}
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Hand the unmasked aggregate to the sink, then aggregate as the wrapped does."""
        if results:
            try:
                self.sink(self._intercept(server_round, results))
            except Exception:  # the federation goes on whatever the attack side does
                log.exception("the aggregate sink failed on round %d", server_round)
        return self.strategy.aggregate_fit(server_round, results, failures)

    def _intercept(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]]
    ) -> InterceptedAggregate:
        # SecAgg+ set every result's parameters to the one unmasked average.
        arrays = parameters_to_ndarrays(results[0][1].parameters)
        w, b = self.layer
        sent = self._sent[server_round]
        summed = {proxy.node_id for proxy, _ in results}
        # What the average would be had no client trained: the sent layers, weighted as SecAgg+
        # weighs each client's parameters (by its num_examples).
        weights = [(res.num_examples, sent[proxy.node_id]) for proxy, res in results]
        total = sum(n for n, _ in weights)
        sent_weight, sent_bias = (
            np.sum([n * layer[i].astype(np.float64) for n, layer in weights], axis=0) / total
            for i in (0, 1)
        )
        return InterceptedAggregate(
            server_round=server_round,
            node_ids=tuple(proxy.node_id for proxy, _ in results),
            declared=tuple(dict(res.metrics) for _, res in results),
            num_examples=tuple(res.num_examples for _, res in results),
            dropped=tuple(sorted(set(sent) - summed)),
            sent_weight=sent_weight,
            sent_bias=sent_bias,
            weight=arrays[w],
            bias=arrays[b],
            trained_at=single_trained_layer([sent[proxy.node_id] for proxy, _ in results]),
        )


def never_fires(weight: np.ndarray, bias: np.ndarray) -> bool:
    """Whether a ReLU layer's neurons are inactive for every input: each pre-activation is
    then its bias, and the layer's gradient is zero for every sample."""
    return not weight.any() and bool((bias <= 0).all())


def single_trained_layer(
    layers: list[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray] | None:
    """The one layer the clients whose layer can train were sent (float64), or ``None``
    (see :attr:`InterceptedAggregate.trained_at`)."""
    live = [layer for layer in layers if not never_fires(*layer)]
    if not live:
        return None
    weight, bias = live[0]
    if any(not (np.array_equal(w, weight) and np.array_equal(b, bias)) for w, b in live[1:]):
        return None
    return weight.astype(np.float64), bias.astype(np.float64)
