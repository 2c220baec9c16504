"""The ServerApp's rounds under Flower's SecAgg+: the legacy ``DefaultWorkflow`` with
``SecAggPlusWorkflow`` as its fit workflow, driving a legacy FedAvg that only ever receives the
unmasked, quantised sum of the cohort's replies.

The honest-but-curious server (:class:`strategies.legacy.AggregateCurious`, around that FedAvg)
hands each round's sum to the auditor, which attacks it as one batch of every summed client's
samples. What each client is sent is the scenario's server behaviour's
(:class:`strategies.legacy.LegacyTampering`, between the two): the global model, or a tampered
one, one per client where the behaviour sends several (``isolate``); the global model is
aggregated honestly either way.
A client whose round fails drops out of SecAgg+ (its ClientApp errs, see
:mod:`strategies.legacy.fit_mod`): while enough of its neighbours remain
(``reconstruction_threshold``) the round completes without it, and it is recorded as
``dropped``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, Context
from flwr.common import NDArrays, Scalar, ndarrays_to_parameters
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid

from clients.reply import DROPPED, PARTITION_ID, SERVER_ROUND
from fl_sim.apps.recorder import RunRecorder
from fl_sim.audit.auditor import Auditor
from fl_sim.config.federation import SecAggSpec
from fl_sim.config.schema import Scenario
from strategies import InterceptedAggregate, LeftOut
from strategies.core import Partitions, ServerCore
from strategies.legacy import AggregateCurious, LegacyTampering

log = logging.getLogger(__name__)

# The legacy workflow's record of the global model in the server's context
# (flwr.server.workflow.constant.MAIN_PARAMS_RECORD).
MAIN_PARAMS_RECORD = "parameters"


def secagg_workflow(spec: SecAggSpec) -> DefaultWorkflow:
    """Flower's default legacy workflow with SecAgg+ as its fit workflow, set as ``spec`` says."""
    return DefaultWorkflow(
        fit_workflow=SecAggPlusWorkflow(
            num_shares=spec.num_shares,
            reconstruction_threshold=spec.reconstruction_threshold,
            max_weight=spec.max_weight,
            clipping_range=spec.clipping_range,
            quantization_range=spec.quantization_range,
        )
    )


class _Dropouts:
    """Who dropped out of each round: a node the cohort's earlier sums named, else the one
    partition missing from the sum (every client is sampled every round)."""

    def __init__(
        self, count: int, left_out: Callable[[LeftOut], None], partitions: Partitions
    ) -> None:
        self.count = count
        self.left_out = left_out
        self.partitions = partitions

    def __call__(self, aggregate: InterceptedAggregate) -> None:
        summed = set()
        for node, declared in zip(aggregate.node_ids, aggregate.declared, strict=True):
            client = int(declared[PARTITION_ID])
            self.partitions.learn(node, client)
            summed.add(client)
        missing = set(range(self.count)) - summed
        of = self.partitions.known()
        known: dict[int, int] = {n: of[n] for n in aggregate.dropped if n in of}
        unknown = [n for n in aggregate.dropped if n not in known]
        left = sorted(missing - set(known.values()))
        if len(unknown) == 1 and len(left) == 1:
            known[unknown[0]] = left[0]
        for node in aggregate.dropped:
            who = known.get(node)
            self.left_out(
                LeftOut(
                    server_round=aggregate.server_round,
                    node_id=node,
                    client=who,
                    status=DROPPED,
                    reason="no masked vector came: SecAgg+ unmasked the sum without it "
                    "(its round failed, or it left)",
                    declared={SERVER_ROUND: aggregate.server_round}
                    | ({PARTITION_ID: who} if who is not None else {}),
                )
            )


def federate_secagg(
    grid: Grid,
    context: Context,
    scenario: Scenario,
    recorder: RunRecorder,
    auditor: Auditor | None,
    start: ArrayRecord,
    layer: tuple[str, str],
    left_out: Callable[[LeftOut], None],
    core: ServerCore,
) -> ArrayRecord:
    """Every round of ``scenario`` under SecAgg+ from the global model ``start``, the sum
    attacked at ``layer`` (its weight and bias keys) when there is an ``auditor``, each client
    sent what ``core`` gives it; returns the final global model."""
    spec = scenario.federation.secagg
    if spec is None:
        raise ValueError("the scenario has no [federation.secagg]")
    keys = list(start.keys())
    n = len(scenario.clients)

    def evaluate(
        server_round: int, arrays: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, dict[str, Scalar]]:
        state = {k: torch.from_numpy(a) for k, a in zip(keys, arrays, strict=True)}
        metrics = recorder.evaluate(server_round, ArrayRecord(state))
        return float(metrics["test-loss"]), dict(metrics)  # type: ignore[arg-type]

    fedavg = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n,
        min_available_clients=n,
        evaluate_fn=evaluate,
        on_fit_config_fn=lambda r: {SERVER_ROUND: r},
        initial_parameters=ndarrays_to_parameters(start.to_numpy_ndarrays()),
        fit_metrics_aggregation_fn=recorder.legacy_client_metrics,
    )
    dropouts = _Dropouts(n, left_out, core.partitions)

    def sink(aggregate: InterceptedAggregate) -> None:
        dropouts(aggregate)
        if auditor is not None:
            auditor.queue_aggregate(aggregate, spec)

    positions = (keys.index(layer[0]), keys.index(layer[1]))
    strategy = AggregateCurious(LegacyTampering(fedavg, core, positions), sink, core, positions)
    legacy = LegacyContext(
        context, config=ServerConfig(num_rounds=scenario.rounds), strategy=strategy
    )
    secagg_workflow(spec)(grid, legacy)
    final = legacy.state.array_records.get(MAIN_PARAMS_RECORD)
    if not isinstance(final, ArrayRecord) or not len(final):
        return start
    arrays = final.to_numpy_ndarrays()
    return ArrayRecord({k: torch.from_numpy(a) for k, a in zip(keys, arrays, strict=True)})
