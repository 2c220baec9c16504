"""``fl-sim run``: a federation scenario in Flower's simulation, audited as it runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fl_sim.cli.errors import BadInput
from fl_sim.cli.summary import print_summary


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim run``."""
    run = sub.add_parser("run", help="run a federation scenario (TOML) in Flower's simulation")
    run.add_argument("config", help="scenario file, e.g. configs/quickstart.toml")
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
    run.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from fl_sim.config import ConfigError, load_scenario
    from fl_sim.run import EXIT_INTERRUPTED, RunStoppedError, run_scenario
    from fl_sim.rundir import REPORT, last_round

    try:
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
        )
    except ConfigError as err:  # a runtime that cannot run the scenario: nothing ran
        raise BadInput(f"fl-sim run: {err}") from None
    except RunStoppedError as stopped:
        print_summary(stopped.run_dir)
        print(
            f"\nfl-sim run: {stopped} after round {last_round(stopped.run_dir)} of "
            f"{scenario.rounds}; the summary and {stopped.run_dir / REPORT} show what "
            "was recorded until then",
            file=sys.stderr,
        )
        return stopped.exit_code
    except KeyboardInterrupt:  # a second Ctrl-C, or one while the report was being written
        print("\nfl-sim run: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    print_summary(run_dir)
    return 0
