"""``fl-sim bench sweep`` (the largest batch attacked exactly, per width) and ``fl-sim bench
limits`` (sweeps run apart, joined)."""

from __future__ import annotations

import argparse
from pathlib import Path

from attacks import SpearConfig
from fl_sim.bench.converge import Convergence
from fl_sim.bench.invocation import (
    DATA_HELP,
    bench_data,
    command_line,
    results_folder,
    training_split,
)
from fl_sim.bench.pretrain import Pretraining, add_pretraining_options


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench sweep`` and ``fl-sim bench limits``."""
    sweep = bench.add_parser(
        "sweep", help="largest batch size attacked exactly (>= 90%% of samples), per width"
    )
    sweep.add_argument("--widths", default="1000,2000,4000", help="comma-separated m")
    sweep.add_argument("--start", default="60,120,200", help="first B, one per width")
    sweep.add_argument("--step", default="10,20,20", help="B increment, one per width")
    sweep.add_argument("--seeds", default="0,1,2")
    sweep.add_argument(
        "--data",
        required=True,
        help=DATA_HELP,
    )
    sweep.add_argument("--split", choices=("train", "test"), default="test")
    sweep.add_argument("--time-budget", type=float, default=600.0, help="seconds per attack")
    sweep.add_argument("--out", help="results folder (default: bench/runs/sweep-TIME)")
    add_pretraining_options(
        sweep.add_argument_group(
            "pre-training: sweep trained networks (SGD on other images of --data), for the "
            "limit plot's trained line"
        ),
        default_steps=0,
    )
    sweep.add_argument(
        "--converged",
        type=int,
        metavar="EPOCHS",
        help="sweep networks trained this many epochs on the whole training split of --data "
        "(an image folder with train/ and test/, or cifar-10-batches-py), attacked on its test "
        "images",
    )
    sweep.add_argument(
        "--own-images",
        action="store_true",
        help="with --converged: attack batches of the images the network trained on (memorised "
        "data) rather than unseen test images",
    )
    sweep.add_argument(
        "--uncentred",
        action="store_true",
        help="pixels on [0, 1], as ToTensor() gives them without Normalize",
    )
    sweep.set_defaults(func=_sweep)
    limits = bench.add_parser(
        "limits", help="join sweeps run apart (one width each) into one table and plot"
    )
    limits.add_argument("sweeps", nargs="+", help="folders of `fl-sim bench sweep` runs")
    limits.add_argument("--out", required=True, help="results folder")
    limits.set_defaults(func=_limits)


def _sweep(args: argparse.Namespace) -> int:
    from fl_sim.bench.sweep import SweepPlan, run_sweep

    widths = [int(w) for w in args.widths.split(",")]
    starts = [int(b) for b in args.start.split(",")]
    steps = [int(b) for b in args.step.split(",")]
    if not len(starts) == len(steps) == len(widths):
        raise SystemExit(
            f"fl-sim bench sweep: --start ({len(starts)} values) and --step ({len(steps)}) need "
            f"one value per width in --widths ({len(widths)})"
        )
    try:
        plans = [
            SweepPlan(m, b, s, min(m, 3072) - 1)
            for m, b, s in zip(widths, starts, steps, strict=True)
        ]
        attack = SpearConfig(time_budget_s=args.time_budget)
        pretrain = Pretraining(args.pretrain_steps, args.pretrain_lr, args.pretrain_batch)
        converged = None if args.converged is None else Convergence(epochs=args.converged)
    except ValueError as err:
        raise SystemExit(f"fl-sim bench sweep: {err}") from None
    if converged is not None and pretrain.steps:
        raise SystemExit("fl-sim bench sweep: --converged and --pretrain-steps both train")
    if args.own_images and converged is None:
        raise SystemExit("fl-sim bench sweep: --own-images needs --converged EPOCHS")
    data = bench_data(args.data, args.split)
    train = None if converged is None else training_split(args.data, args.split, "sweep")
    out = results_folder(args.out, "sweep")
    seeds = tuple(int(s) for s in args.seeds.split(","))
    limits = run_sweep(
        plans,
        data,
        out,
        seeds=seeds,
        attack=attack,
        command=command_line(),
        pretrain=pretrain,
        converged=converged,
        train=train,
        centred=not args.uncentred,
        own_images=args.own_images,
    )
    print((out / "summary.md").read_text())
    print(f"results in {out}/ (summary.md, sweep.json, rows.jsonl, limit.png); limits {limits}")
    return 0


def _limits(args: argparse.Namespace) -> int:
    from fl_sim.bench.sweep import combine_sweeps

    out = Path(args.out)
    try:
        limits = combine_sweeps([Path(f) for f in args.sweeps], out)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"fl-sim bench limits: {err}") from None
    print((out / "summary.md").read_text())
    print(f"results in {out}/ (summary.md, sweep.json, limit.png); limits {limits}")
    return 0
