"""The ServerApp: FedAvg over every client, each round, with the global model tested centrally
(under a federation-wide defence: inside Flower's central DP wrapper, or behind SecAgg+, see
:mod:`fl_sim.apps.secagg_server`).

What the clients are sent is the scenario's server behaviour's (a
:class:`strategies.core.ServerCore`, which :class:`strategies.Tampering` applies here and
:class:`strategies.legacy.LegacyTampering` under SecAgg+): the global model itself (``honest``),
or one with a first layer shaped to leak more, one per client where the behaviour sends several;
the global model is aggregated honestly either way, and the audit attacks each update against
what its client was sent.

Every reply is screened first (:class:`strategies.FaultTolerant`): a client that failed or sent
what cannot be aggregated is recorded, in ``clients.jsonl`` and the audit, and left out, and
the run goes on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from fl_sim.apps.central_dp import central_epsilon, with_central_dp
from fl_sim.apps.checkpoint import load_global
from fl_sim.apps.client import drawn_samples
from fl_sim.apps.interruption import InterruptibleGrid, Interruption, RunInterruptedError
from fl_sim.apps.recorder import RunRecorder
from fl_sim.apps.secagg_server import federate_secagg
from fl_sim.audit.auditor import Auditor, counted
from fl_sim.audit.context import AuditContext
from fl_sim.audit.log import AuditLog
from fl_sim.audit.reaudit import resumed_auditor
from fl_sim.config.schema import Scenario
from fl_sim.data.description import DataDescription
from fl_sim.progress import RunProgress
from fl_sim.rundir import MODEL
from strategies import (
    FaultTolerant,
    HonestButCurious,
    LeftOut,
    RoundOffset,
    Tampering,
)
from strategies.core import ServerCore

log = logging.getLogger(__name__)


def initial_arrays(scenario: Scenario, data: DataDescription) -> ArrayRecord:
    """The global model at round 0 for inputs described by ``data``, seeded by the scenario."""
    torch.manual_seed(scenario.seed)
    return ArrayRecord(scenario.model.build(data).state_dict())


def build_strategy(scenario: Scenario, recorder: RunRecorder) -> Strategy:
    """FedAvg that trains every client each round and evaluates only centrally; under central
    DP inside Flower's fixed-clipping wrapper (:func:`fl_sim.apps.central_dp.with_central_dp`)."""
    n = len(scenario.clients)
    fedavg = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=n,
        min_available_nodes=n,
        train_metrics_aggr_fn=recorder.client_metrics,
    )
    dp = scenario.federation.central_dp
    return fedavg if dp is None else with_central_dp(fedavg, dp, n)


def run_federation(
    grid: Grid,
    context: Context,
    scenario: Scenario,
    run_dir: Path,
    interruption: Interruption | None = None,
    progress: RunProgress | None = None,
) -> None:
    """All rounds of ``scenario`` on ``grid``, recorded in ``run_dir``; with the audit on, the
    server is honest but curious and every attack is collected before this returns. With
    ``progress``, each round's test metrics and the attacks queued are shown there.

    With ``interruption``, a requested stop ends the run at the server's next wait for
    replies (:class:`~fl_sim.apps.interruption.RunInterruptedError`): the attacks still running are
    recorded as interrupted, without waiting for them, and ``interruption.done()`` is called
    however the run ended. Under SecAgg+ the legacy workflow keeps its state in ``context``,
    the ServerApp's.
    """
    if interruption is not None:
        interruption.begin()
    try:
        _federate(grid, context, scenario, run_dir, interruption, progress)
    except RunInterruptedError:  # asked for: the main thread reports what was recorded
        log.info("the server stopped: the run was interrupted")
    finally:
        if interruption is not None:
            interruption.done()


def _federate(
    grid: Grid,
    context: Context,
    scenario: Scenario,
    run_dir: Path,
    interruption: Interruption | None,
    progress: RunProgress | None,
) -> None:
    if interruption is not None:
        grid = InterruptibleGrid(grid, interruption)
    recorder = RunRecorder(
        scenario, run_dir, progress=progress, round_epsilon=central_epsilon(scenario)
    )
    resumed = load_global(run_dir)
    if resumed is not None:
        if scenario.federation.wide_defence:
            raise ValueError(
                f"{run_dir} cannot resume its federation: SecAgg+ and central DP run on "
                "Flower's legacy workflow, which keeps its state in memory (fl-sim audit "
                "RUN_DIR resumes the audit)"
            )
        recorder.resume_after(resumed[0])
        log.info("resuming after round %d of %d", resumed[0], scenario.rounds)
    strategy: Strategy = build_strategy(scenario, recorder)
    described = recorder.data.description
    layer = scenario.model.attacked_layer(described)
    core = ServerCore(scenario.server.behaviour, recorder.public_inputs(), scenario.seed)
    strategy = Tampering(strategy, core, layer)
    auditor = None
    if scenario.audit.enabled:
        audit_context = AuditContext.for_scenario(
            scenario,
            run_dir,
            data=recorder.data,
            draws=functools.partial(drawn_samples, scenario, recorder.data),
        )
        if resumed is None:
            auditor = Auditor(audit_context)
        else:  # what the killed run had queued and not finished; later rounds run again
            auditor, _ = resumed_auditor(audit_context, AuditLog(run_dir), resumed[0])
        strategy = HonestButCurious(
            strategy, counted(auditor, progress), layer, keep_whole=auditor.keeps_whole, core=core
        )

    def left_out(fault: LeftOut) -> None:
        recorder.left_out(fault)
        if auditor is not None:
            auditor.left_out(fault)

    try:
        done, start = resumed if resumed is not None else (0, initial_arrays(scenario, described))
        if scenario.federation.secagg is not None:
            final = federate_secagg(
                grid, context, scenario, recorder, auditor, start, layer, left_out, core
            )
        else:
            result = RoundOffset(FaultTolerant(strategy, left_out, core.partitions), done).start(
                grid=grid,
                initial_arrays=start,
                num_rounds=scenario.rounds - done,
                evaluate_fn=recorder.evaluate
                if resumed is None
                else _after(recorder.evaluate, done),
            )
            # Flower's result holds the last aggregate: none when every round failed, and the
            # global model is then the initial one.
            final = result.arrays if len(result.arrays) else start
        torch.save(final.to_torch_state_dict(), run_dir / MODEL)
    finally:
        if auditor is not None:
            auditor.finish(
                interrupted=interruption is not None and interruption.requested,
                waiting=progress.waiting if progress is not None else None,
            )


def _after(
    evaluate: Callable[[int, ArrayRecord], MetricRecord], done: int
) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    """``evaluate`` at the rounds of a federation resumed after round ``done``: Flower's round
    r is its round done + r, and its round 0, tested before, is not tested again."""
    return lambda server_round, arrays: (
        None if server_round == 0 else evaluate(done + server_round, arrays)
    )


def make_server_app(
    scenario: Scenario,
    run_dir: Path,
    interruption: Interruption | None = None,
    progress: RunProgress | None = None,
) -> ServerApp:
    """A ServerApp that runs ``scenario`` and records into ``run_dir`` (stopping early when
    ``interruption`` says so; showing its rounds and attacks on ``progress``)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_federation(grid, context, scenario, run_dir, interruption, progress)

    return app
