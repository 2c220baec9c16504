"""``fl-sim bench attack``: SPEAR++ on client updates of real CIFAR-10 images or tabular
records, a preset's cases or one from the command line."""

from __future__ import annotations

import argparse
from typing import get_args

import torch

from attacks import SpearConfig, paper_config
from attacks.spearpp.config import NullStep, Optimiser, Search, Surrogate
from clients.defences import training_defences, training_settings
from fl_sim.bench.attack import run_bench
from fl_sim.bench.cases import ARRAYS, DATASETS, IMAGES, PRESETS, AttackCase, noise_blind
from fl_sim.bench.invocation import (
    DATA_HELP,
    bench_data,
    command_line,
    results_folder,
    training_split,
)
from fl_sim.bench.pretrain import Pretraining, add_pretraining_options
from fl_sim.config.schema import ModelSpec


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench attack``."""
    attack = bench.add_parser("attack", help="SPEAR++ on client updates of real CIFAR-10 images")
    attack.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    attack.add_argument("--only", nargs="*", help="keep cases whose name contains one of these")
    attack.add_argument("--seeds", help="comma-separated seeds (default: the preset's, or 0)")
    attack.add_argument(
        "--data",
        help=DATA_HELP + " (needed unless every case attacks a tabular set)",
    )
    attack.add_argument("--split", choices=("train", "test"), default="test")
    attack.add_argument(
        "--dtype",
        choices=get_args(ModelSpec.model_fields["dtype"].annotation),
        default="float64",
        help="precision of the client's model and gradient",
    )
    custom = attack.add_argument_group(
        "a custom case (instead of a preset, when --batch-size is given)"
    )
    custom.add_argument("--batch-size", type=int, help="B")
    custom.add_argument("--width", type=int, default=200, help="m")
    custom.add_argument("--depth", type=int, default=6)
    custom.add_argument(
        "--search",
        choices=get_args(Search),
        default="signs",
        help="sign-consistency search first (default), or the surrogate search only",
    )
    custom.add_argument(
        "--null-step",
        choices=get_args(NullStep),
        default="auto",
        help="the sign search's null steps: exact eigh, inverse iteration (no host syncs), or "
        "auto (inverse iteration on every device: measured faster and of wider reach)",
    )
    custom.add_argument("--surrogate", choices=get_args(Surrogate), default="l1")
    custom.add_argument("--optimiser", choices=get_args(Optimiser), default="radam")
    custom.add_argument("--method", choices=("fl-sim", "paper"), default="fl-sim")
    custom.add_argument("--starts", type=int, default=2000)
    custom.add_argument("--steps", type=int, default=1000)
    custom.add_argument("--max-passes", type=int, default=8)
    custom.add_argument("--defence", choices=list(training_defences()), default="fedsgd")
    custom.add_argument("--lr", type=float, default=0.01)
    custom.add_argument("--epochs", type=int, default=1)
    custom.add_argument("--mini-batch", type=int)
    custom.add_argument("--clip", type=float, default=1.0)
    custom.add_argument("--sigma", type=float, default=0.0, help="DP noise multiplier")
    custom.add_argument("--knows-batch-size", action="store_true")
    custom.add_argument(
        "--arrays",
        choices=ARRAYS,
        default="tensors",
        help="how the update reaches the attack: the client's tensors, widened to float64 "
        "numpy arrays, or (sent - received) / lr computed in float64",
    )
    custom.add_argument(
        "--dataset",
        choices=DATASETS,
        default=IMAGES,
        help="the images of --data, or a tabular set that ships offline",
    )
    custom.add_argument(
        "--uncentred",
        action="store_true",
        help="inputs on [0, 1]: pixels as ToTensor() gives them without Normalize, records "
        "min-max scaled (default: pixels centred by CIFAR-10's channel statistics, records "
        "standardised)",
    )
    attack.add_argument(
        "--noise-blind",
        action="store_true",
        help="do not tell the attacker the DP noise level: it fits it to the gradient's spectrum",
    )
    attack.add_argument(
        "--time-budget",
        type=float,
        help="seconds per reconstruction after which no new pass starts",
    )
    add_pretraining_options(
        attack.add_argument_group(
            "pre-training: attack every case on a trained network (SGD on other images of --data)"
        ),
        default_steps=None,
    )
    attack.add_argument(
        "--svd-reference",
        action="store_true",
        help="after each attack, time one full float64 SVD of the same gradient (torch.linalg.svd) "
        "and report the attack's time as a multiple of it",
    )
    attack.add_argument("--out", help="results folder (default: bench/runs/attack-PRESET-TIME)")
    attack.set_defaults(func=_main)


def _custom_case(args: argparse.Namespace) -> AttackCase:
    """One case from the command line's --batch-size, --width, ... options."""
    try:
        given = {
            "lr": args.lr,
            "epochs": args.epochs,
            "mini_batch": args.mini_batch,
            "clip": args.clip,
            "noise_multiplier": args.sigma,
        }
        fields = training_defences()[args.defence].Settings.model_fields
        training = training_settings(
            args.defence, **{k: v for k, v in given.items() if k in fields}
        )
        attack = SpearConfig(
            search=args.search,
            null_step=args.null_step,
            surrogate=args.surrogate,
            optimiser=args.optimiser,
            starts=args.starts,
            steps=args.steps,
            max_passes=args.max_passes,
        )
        if args.method == "paper":
            attack = paper_config(args.surrogate, args.optimiser).replace(
                starts=args.starts, steps=args.steps
            )
    except ValueError as err:
        raise SystemExit(f"fl-sim bench attack: {err}") from None
    name = (
        f"{args.surrogate} {args.optimiser} {args.defence} B={args.batch_size} "
        f"m={args.width} depth={args.depth}"
        + (" [paper method]" if args.method == "paper" else "")
        + (" [0, 1] inputs" if args.uncentred else "")
        + (f" [{args.dataset}]" if args.dataset != IMAGES else "")
    )
    return AttackCase(
        name,
        args.batch_size,
        args.width,
        args.depth,
        training=training,
        attack=attack,
        knows_batch_size=args.knows_batch_size,
        arrays=args.arrays,
        centred=not args.uncentred,
        dataset=args.dataset,
    )


def _main(args: argparse.Namespace) -> int:
    cases: tuple[AttackCase, ...] = (
        (_custom_case(args),) if args.batch_size is not None else PRESETS[args.preset]
    )
    if args.only:
        cases = tuple(c for c in cases if any(s in c.name for s in args.only))
        if not cases:
            raise SystemExit(f"--only {args.only}: no case of preset {args.preset!r} matches")
    if args.time_budget is not None:
        cases = tuple(
            AttackCase(**{**c.__dict__, "attack": c.attack.replace(time_budget_s=args.time_budget)})
            for c in cases
        )
    if args.seeds is not None:
        seeds = tuple(int(s) for s in args.seeds.split(","))
        cases = tuple(AttackCase(**{**c.__dict__, "seeds": seeds}) for c in cases)
    if args.pretrain_steps is not None:
        try:
            pre = Pretraining(args.pretrain_steps, args.pretrain_lr, args.pretrain_batch)
            cases = tuple(
                AttackCase(**{**c.__dict__, "pretrain": pre, "name": c.name + pre.label})
                for c in cases
            )
        except ValueError as err:  # bad settings, or a preset whose networks train already
            raise SystemExit(f"fl-sim bench attack: {err}") from None
    if args.noise_blind:
        cases = tuple(c if not c.knows_noise else noise_blind(c) for c in cases)
    if args.data is None:
        images = [c.name for c in cases if c.dataset == IMAGES]
        if images:
            raise SystemExit(
                f"fl-sim bench attack: --data is needed, case {images[0]!r} attacks images"
            )
    data = bench_data(args.data, args.split) if args.data is not None else None
    converged = any(c.converged for c in cases)
    train = training_split(args.data, args.split, "attack") if converged else None
    out = results_folder(args.out, f"attack-{args.preset}")
    command = command_line()
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    run_bench(
        cases,
        data,
        out,
        dtype=dtype,
        command=command,
        svd_reference=args.svd_reference,
        train=train,
    )
    print((out / "summary.md").read_text())
    print(f"results in {out}/ (summary.md, summary.json, rows.jsonl)")
    return 0
