"""``fl-sim audit``: resume (or redo) a run's audit from what it stored."""

from __future__ import annotations

import argparse
from pathlib import Path

from fl_sim.cli.errors import BadInput
from fl_sim.report.terminal import print_summary


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim audit``."""
    audit = sub.add_parser(
        "audit", help="resume (or --redo) the audit of a run from its stored updates"
    )
    audit.add_argument("run_dir")
    audit.add_argument("--redo", action="store_true", help="attack every stored update again")
    audit.add_argument(
        "--max-memory-gb",
        type=float,
        metavar="GB",
        help="the attack workers' memory budget (default: the run's audit.max_memory_gb); "
        "the attacks recorded out_of_memory are redone under it",
    )
    audit.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from fl_sim.audit.log import AuditBusyError
    from fl_sim.audit.reaudit import reaudit
    from fl_sim.report import build_report

    run_dir = Path(args.run_dir)
    try:
        queued = reaudit(run_dir, redo=args.redo, max_memory_gb=args.max_memory_gb)
    except FileNotFoundError as err:  # nothing in RUN_DIR says how to audit it
        raise BadInput(f"fl-sim audit: {err}") from None
    except ValidationError as err:  # the budget does not hold the workers, or is not > 0
        why = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
        raise BadInput(f"fl-sim audit: --max-memory-gb {args.max_memory_gb}: {why}") from None
    except AuditBusyError as err:
        raise SystemExit(f"fl-sim audit: {err}") from None
    print(f"{queued} updates attacked")
    build_report(run_dir)
    print_summary(run_dir)
    return 0
