"""``fl-sim run``: a federation scenario in Flower's simulation, audited as it runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fl_sim.cli.errors import BadInput
from fl_sim.report.terminal import print_summary

if TYPE_CHECKING:
    from fl_sim.config import Scenario


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim run``."""
    run = sub.add_parser("run", help="run a federation scenario (TOML) in Flower's simulation")
    run.add_argument(
        "config", nargs="?", help="scenario file, e.g. configs/quickstart.toml (not with --resume)"
    )
    run.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a key, e.g. --set clients.3.defence=dp (repeatable)",
    )
    run.add_argument("--out", help="run directory (default: runs/NAME-TIME); never overwritten")
    run.add_argument(
        "--runtime",
        choices=("auto", "flwr", "legacy"),
        default="auto",
        help="Flower runtime: flwr (flwr run with the simulation runtime), legacy (the "
        "deprecated run_simulation, which SecAgg+, central DP and a Ray cluster need), auto "
        "(flwr unless the scenario needs legacy; the default)",
    )
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="go on with a run that was killed or stopped, after the last round its server "
        "completed (its scenario, runtime and records from RUN_DIR)",
    )
    run.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from fl_sim.config import ConfigError, load_scenario
    from fl_sim.run import EXIT_INTERRUPTED, RunStoppedError, run_scenario
    from fl_sim.rundir import REPORT, last_round

    resume = Path(args.resume) if args.resume else None
    try:
        if resume is not None:
            scenario, resolved = _resumable(resume, args)
        elif args.config is None:
            raise ConfigError("name a scenario file, or a run directory with --resume")
        else:
            scenario, resolved = load_scenario(Path(args.config), args.set or ())
    except ConfigError as err:
        raise BadInput(f"fl-sim run: {err}") from None
    try:
        run_dir = run_scenario(
            scenario,
            resolved,
            Path(args.out) if args.out else None,
            show_progress=not args.quiet,
            runtime=args.runtime,
            resume=resume,
        )
    except ConfigError as err:  # a runtime that cannot run the scenario: nothing ran
        raise BadInput(f"fl-sim run: {err}") from None
    except RunStoppedError as stopped:
        print_summary(stopped.run_dir)
        print(
            f"\nfl-sim run: {stopped} after round {last_round(stopped.run_dir)} of "
            f"{scenario.rounds}; the summary and {stopped.run_dir / REPORT} show what "
            f"was recorded until then; `fl-sim run --resume {stopped.run_dir}` goes on",
            file=sys.stderr,
        )
        return stopped.exit_code
    except KeyboardInterrupt:  # a second Ctrl-C, or one while the report was being written
        print("\nfl-sim run: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    print_summary(run_dir)
    return 0


def _resumable(run_dir: Path, args: argparse.Namespace) -> tuple[Scenario, dict[str, Any]]:
    """The scenario of ``run_dir``, a run ``fl-sim run --resume`` can go on with.

    Raises
    ------
    ConfigError
        Naming what stands in the way: other arguments, a folder that is no fl-sim run, a
        federation-wide defence (its legacy workflow keeps its state in memory), or no round
        the server completed.
    """
    from fl_sim.config import ConfigError, parse_scenario
    from fl_sim.rundir import CHECKPOINT, SCENARIO, read_json

    given = [name for name in ("config", "set", "out") if getattr(args, name)]
    if given:
        raise ConfigError(f"--resume takes the run's own scenario: drop {', '.join(given)}")
    resolved = read_json(run_dir / SCENARIO).get("resolved") if run_dir.is_dir() else None
    if not isinstance(resolved, dict):
        raise ConfigError(f"--resume {run_dir}: not a run directory of fl-sim run ({SCENARIO})")
    scenario = parse_scenario(resolved)
    if scenario.federation.wide_defence:
        raise ConfigError(
            f"--resume {run_dir}: SecAgg+ and central DP run on Flower's legacy workflow, "
            f"which keeps its state in memory; `fl-sim audit {run_dir}` resumes the audit"
        )
    if not (run_dir / CHECKPOINT).is_file():
        raise ConfigError(
            f"--resume {run_dir}: no round was completed ({CHECKPOINT} is missing): run it again"
        )
    return scenario, resolved
