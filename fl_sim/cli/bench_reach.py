"""``fl-sim bench reach``: what limits the sign search (the judge's view)."""

from __future__ import annotations

import argparse

from attacks import SpearConfig
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.invocation import DATA_HELP, bench_data, command_line, results_folder
from fl_sim.bench.pretrain import Pretraining, add_pretraining_options


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench reach``."""
    reach = bench.add_parser(
        "reach",
        help="what limits the sign search: fixed points, basins, and deflation by estimated "
        "against exact inputs (judge's view)",
    )
    reach.add_argument("--batch-sizes", required=True, help="comma-separated B")
    reach.add_argument("--width", type=int, required=True, help="m")
    reach.add_argument("--seeds", default="0")
    reach.add_argument("--per-round", type=int, default=32, help="random starts per round")
    reach.add_argument(
        "--patience", type=int, default=4, help="rounds in a row that find nothing before a stop"
    )
    reach.add_argument(
        "--free-iterations",
        help="comma-separated counts of final sign iterations without deflation to run the "
        "rounds with, beside the engine's",
    )
    reach.add_argument(
        "--data",
        required=True,
        help=DATA_HELP,
    )
    reach.add_argument("--split", choices=("train", "test"), default="test")
    reach.add_argument("--out", help="results folder (default: bench/runs/reach-TIME)")
    add_pretraining_options(reach.add_argument_group("pre-training"), default_steps=0)
    reach.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from fl_sim.bench.reach import run_reach

    try:
        pretrain = Pretraining(args.pretrain_steps, args.pretrain_lr, args.pretrain_batch)
        seeds = tuple(int(s) for s in args.seeds.split(","))
        given = args.free_iterations.split(",") if args.free_iterations else []
        free = tuple(int(f) for f in given)
        cases = [
            AttackCase(f"B={b} m={args.width}", b, args.width, seeds=seeds, pretrain=pretrain)
            for b in (int(b) for b in args.batch_sizes.split(","))
        ]
    except ValueError as err:
        raise SystemExit(f"fl-sim bench reach: {err}") from None
    if any(not 0 <= f <= SpearConfig().sign_iterations for f in free):
        raise SystemExit(
            f"fl-sim bench reach: --free-iterations {args.free_iterations}: each must be 0 to "
            f"{SpearConfig().sign_iterations} (the sign search's iterations)"
        )
    if args.per_round < 1 or args.patience < 1:
        raise SystemExit(
            f"fl-sim bench reach: --per-round ({args.per_round}) and --patience "
            f"({args.patience}) must be >= 1"
        )
    data = bench_data(args.data, args.split)
    out = results_folder(args.out, "reach")
    run_reach(
        cases,
        data,
        out,
        per_round=args.per_round,
        patience=args.patience,
        free_iterations=free,
        command=command_line(),
        progress=print,
    )
    print((out / "summary.md").read_text())
    print(f"results in {out}/ (summary.md, rows.jsonl, meta.json)")
    return 0
