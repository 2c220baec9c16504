"""Running a scenario in Flower's simulation engine, into a fresh run directory.

The federation runs on ``flwr run`` with the simulation runtime
(:mod:`fl_sim.apps.flwr_simulation`) unless the scenario needs Flower's deprecated
``run_simulation`` (:mod:`fl_sim.apps.in_process`: SecAgg+, central DP, a Ray cluster);
:func:`~fl_sim.apps.runtime.choose_runtime` decides, or the caller forces one.

However the run ends (every round done, Ctrl-C, an error) the directory gets its plots and
``report.html`` from what was recorded; a run that did not finish raises :class:`RunStoppedError`
afterwards, naming its directory.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from fl_sim import rundir
from fl_sim.apps.client import make_client_app
from fl_sim.apps.flwr_simulation import FlwrSimulation
from fl_sim.apps.in_process import simulate
from fl_sim.apps.interruption import Interruption
from fl_sim.apps.runtime import AUTO, FLWR, RUNTIME_LABELS, choose_runtime, legacy_reasons
from fl_sim.apps.server import make_server_app
from fl_sim.config.schema import Scenario
from fl_sim.data.federated import federated_data
from fl_sim.progress import RunProgress
from fl_sim.report import build_report
from fl_sim.report.plots import plot_accuracy
from fl_sim.rundir import write_scenario

log = logging.getLogger(__name__)

# After Ctrl-C, how long the server thread gets to file what is pending and stop.
STOP_GRACE_S = 60.0
# The shell's exit status for a command ended by SIGINT (128 + 2).
EXIT_INTERRUPTED = 130


class RunStoppedError(Exception):
    """A run that ended before its last round; its directory holds what was recorded, with
    the report built from it.

    Attributes
    ----------
    run_dir
        The run directory.
    exit_code
        The exit status ``fl-sim run`` ends with: 130 after Ctrl-C, 1 after an error.
    """

    def __init__(self, run_dir: Path, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.run_dir = run_dir
        self.exit_code = exit_code


def run_scenario(
    scenario: Scenario,
    resolved: dict[str, Any],
    out: Path | None = None,
    show_progress: bool = True,
    runtime: str = AUTO,
    resume: Path | None = None,
) -> Path:
    """Run ``scenario`` with Flower's Ray-backed simulation; returns the run directory.
    ``show_progress``: rounds and attacks on stderr as the run goes (:class:`RunProgress`).
    ``runtime``: ``flwr`` (``flwr run`` with the simulation runtime), ``legacy``
    (``run_simulation``) or ``auto`` (``flwr`` unless the scenario needs ``legacy``).
    ``resume``: a run directory of ``scenario`` whose run was killed or stopped: the
    federation goes on after the last round the server completed (its global model, the
    clients' states and the audit's unfinished attacks from the directory), on the runtime
    it ran on.

    The directory holds ``scenario.json`` (the resolved config), ``data.json`` (which dataset
    was actually used, its input shape, classes, value range and normalisation),
    ``rounds.jsonl``, ``clients.jsonl``, ``audit.jsonl``, ``grids/`` (image grids, or
    heat-maps of tabular records), ``plots/``, ``run.log``, ``accuracy.png`` and
    ``report.html``.

    Raises
    ------
    fl_sim.apps.runtime.RuntimeChoiceError
        Before anything ran, when ``runtime`` cannot run the scenario.
    RunStoppedError
        After Ctrl-C (the server stops at its next wait for replies; attacks in flight are
        recorded as interrupted) or an error, once the report was built from what was
        recorded.
    """
    if resume is None:
        chosen = choose_runtime(scenario, runtime)
        run_dir = rundir.new_run_dir(out, scenario.name)
        write_scenario(run_dir, scenario, resolved, chosen)
    else:
        run_dir = resume
        chosen = str(rundir.read_json(run_dir / rundir.SCENARIO).get("runtime", runtime))
        chosen = choose_runtime(scenario, chosen)
    handler = logging.FileHandler(run_dir / rundir.RUN_LOG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    interruption = Interruption()
    stopped: RunStoppedError | None = None
    progress = RunProgress(scenario.rounds, run_dir) if show_progress else None
    try:
        # The live display ends before the report is built and the summary printed.
        with progress if progress is not None else contextlib.nullcontext():
            try:
                _simulate(scenario, run_dir, interruption, progress, runtime=chosen)
            except KeyboardInterrupt:
                stopped = RunStoppedError(run_dir, "interrupted (Ctrl-C)", EXIT_INTERRUPTED)
            except Exception as err:
                log.exception("the run failed")
                stopped = RunStoppedError(run_dir, f"failed: {type(err).__name__}: {err}", 1)
                stopped.__cause__ = err
            if stopped is not None:
                _wait_for_server(interruption)
                log.warning(
                    "run %s %s after round %d", run_dir, stopped, rundir.last_round(run_dir)
                )
        _write_outputs(run_dir, quiet=stopped is not None)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    if stopped is not None:
        raise stopped
    return run_dir


def _wait_for_server(interruption: Interruption) -> None:
    """Stop the server thread and give it :data:`STOP_GRACE_S` to file what is pending (a
    second Ctrl-C stops waiting)."""
    interruption.request()
    try:
        if not interruption.wait_done(STOP_GRACE_S):
            log.warning("the server did not stop within %.0f s", STOP_GRACE_S)
    except KeyboardInterrupt:
        log.warning("not waiting for the server to stop")


def _write_outputs(run_dir: Path, quiet: bool) -> None:
    """Plots and report from what was recorded; ``quiet``: after a stopped run, whose records
    may be incomplete, a failure to build them is logged, not raised over the run's own."""
    try:
        plot_accuracy(run_dir)
        build_report(run_dir)
    except Exception:
        if not quiet:
            raise
        log.exception("the report of the stopped run could not be built")


def _simulate(
    scenario: Scenario,
    run_dir: Path,
    interruption: Interruption,
    progress: RunProgress | None,
    runtime: str = FLWR,
) -> None:
    """The federation itself, in Flower's simulation engine: on ``flwr run`` (``runtime``
    ``flwr``), else in this process with ``run_simulation``."""
    if runtime == FLWR:
        with FlwrSimulation(scenario, run_dir, progress) as launcher:
            _setup(scenario, run_dir, progress, runtime)
            launcher.run()
        return
    _setup(scenario, run_dir, progress, runtime)
    simulate(
        make_server_app(scenario, run_dir, interruption, progress),
        make_client_app(scenario, run_dir),
        scenario,
    )


def _setup(scenario: Scenario, run_dir: Path, progress: RunProgress | None, runtime: str) -> None:
    """What runs where, in the log and above the progress."""
    data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
    why = "; ".join(legacy_reasons(scenario))
    setup = (
        f"{scenario.name}: {len(scenario.clients)} clients, {scenario.rounds} rounds, data "
        f"{data.source}, Ray {scenario.cluster.ray_address()}, on {RUNTIME_LABELS[runtime]}; "
        f"run directory {run_dir}"
    )
    log.info("run %s", setup)
    if runtime != FLWR and why:
        log.info("run_simulation, not flwr run: %s", why)
    if progress is not None:
        progress.note(setup)
