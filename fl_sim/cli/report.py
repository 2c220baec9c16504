"""``fl-sim report``: rebuild a run directory's report and print its tables."""

from __future__ import annotations

import argparse
from pathlib import Path

from fl_sim.report.terminal import print_summary


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim report``."""
    report = sub.add_parser("report", help="(re)build the report of a run directory")
    report.add_argument("run_dir")
    report.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from fl_sim.report import build_report
    from fl_sim.rundir import is_run_dir

    run_dir = Path(args.run_dir)
    # A run of fl-sim has rounds.jsonl; an audited Flower app of one's own only audit.jsonl.
    if not is_run_dir(run_dir):
        raise SystemExit(
            f"fl-sim report: {run_dir} is not a run directory (no rounds.jsonl, no audit.jsonl)"
        )
    build_report(run_dir)
    print_summary(run_dir)
    return 0
