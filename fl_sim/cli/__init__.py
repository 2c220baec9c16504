"""The ``fl-sim`` command line: one module per command, each registering itself here."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys

from fl_sim.bench import certificates, malicious, memory, scale, secagg, throughput
from fl_sim.cli import (
    attack,
    audit,
    bench_attack,
    bench_lavp,
    bench_reach,
    bench_results,
    bench_sweep,
    report,
    run,
)
from fl_sim.cli.errors import BadInput
from fl_sim.report import compare
from fl_sim.terminal import configure_logging

COMMANDS = (run, audit, report, attack, compare)
BENCH_COMMANDS = (
    bench_attack,
    bench_sweep,
    bench_reach,
    bench_lavp,
    throughput,
    memory,
    scale,
    secagg,
    malicious,
    certificates,
    bench_results,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    # Plain text: the module's docstring is reStructuredText, which argparse prints as is.
    parser = argparse.ArgumentParser(
        prog="fl-sim",
        description="Simulated Flower federations audited by an honest-but-curious server "
        "(SPEAR++), and the attack on any saved update.",
    )
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument(
        "-q", "--quiet", action="store_true", help="only warnings and results (no progress)"
    )
    talk.add_argument(
        "-v", "--verbose", action="store_true", help="also the log's INFO lines (run.log has them)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_command(sub)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    for command in BENCH_COMMANDS:
        command.add_command(bench)
    return parser


def _exit_interrupted() -> int:
    from fl_sim.run import EXIT_INTERRUPTED

    return EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``fl-sim`` console script (``argv`` None: the process's own
    arguments, and the process is the command's)."""
    args = build_parser().parse_args(argv)
    # fl-sim run shows its progress instead of INFO lines; the benchmarks log theirs.
    quiet = args.quiet or (args.command == "run" and not args.verbose)
    configure_logging(logging.WARNING if quiet else logging.INFO)
    try:
        code = int(args.func(args))
    except BadInput as err:  # one line, exit status 2 (the interpreter prints nothing for it)
        print(err, file=sys.stderr)
        raise
    if argv is None and args.command == "run" and code == _exit_interrupted():
        # Ctrl-C also stopped Ray's processes, and Ray's native threads then crashed the
        # interpreter's own shutdown in one run of four here (exit 139, after every file was
        # written): the command's process runs its exit handlers (Ray's stop its agents) and
        # leaves, with the status it owes, without the rest of the shutdown.
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
