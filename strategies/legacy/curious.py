"""The honest-but-curious server under secure aggregation: it sees only the sum, and attacks it.

Flower's ``SecAggPlusWorkflow`` unmasks the cohort's quantised sum and hands it to the legacy
strategy's ``aggregate_fit`` as every client's ``FitRes.parameters`` (the same weighted average
in each): that call is the one place the server holds anything of the clients' updates. What
it is set against is what each summed client was sent, weighted as in the sum: one model for
all from an honest server, one per client from a dishonest one
(:class:`strategies.legacy.LegacyTampering`, inside this wrapper).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

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

from strategies.core import ServerCore
from strategies.core.aggregate import InterceptedAggregate
from strategies.legacy.wrapper import LegacyWrapper

log = logging.getLogger(__name__)

AggregateSink = Callable[[InterceptedAggregate], None]


class AggregateCurious(LegacyWrapper):
    """Wrap a legacy ``flwr.server.strategy`` strategy: same instructions out, same aggregate
    in, the unmasked sum seen first.

    Parameters
    ----------
    strategy
        The legacy strategy SecAgg+'s workflow drives (e.g. ``flwr.server.strategy.FedAvg``,
        inside :class:`strategies.legacy.LegacyTampering`).
    sink
        Receives each round's aggregate reduced to the attacked layer; it must return quickly.
        An exception in it is logged and never reaches the federation.
    core
        What each client was sent (:class:`strategies.core.ServerCore`).
    layer
        Positions of the attacked layer's weight and bias in the legacy parameter list.
    """

    def __init__(
        self, strategy: Strategy, sink: AggregateSink, core: ServerCore, layer: tuple[int, int]
    ) -> None:
        super().__init__(strategy)
        self.sink = sink
        self.core = core
        self.layer = layer
        self._sampled: dict[int, list[int]] = {}

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Delegate, then remember who was sampled."""
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        self._sampled = {server_round: [proxy.node_id for proxy, _ in instructions]}
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
        # SecAgg+ set every result's parameters to the one unmasked average, weighing each
        # client's parameters by its num_examples.
        arrays = parameters_to_ndarrays(results[0][1].parameters)
        w, b = self.layer
        summed = {proxy.node_id for proxy, _ in results}
        sent = self.core.summed(
            server_round, [(proxy.node_id, float(res.num_examples)) for proxy, res in results]
        )
        return InterceptedAggregate(
            server_round=server_round,
            node_ids=tuple(proxy.node_id for proxy, _ in results),
            declared=tuple(dict(res.metrics) for _, res in results),
            num_examples=tuple(res.num_examples for _, res in results),
            dropped=tuple(sorted(set(self._sampled[server_round]) - summed)),
            sent_weight=sent.weight,
            sent_bias=sent.bias,
            weight=arrays[w],
            bias=arrays[b],
            trained_at=sent.trained_at,
        )
