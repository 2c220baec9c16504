"""``fl-sim bench lavp``: do LAVP and the gradient norm forecast the optimisation attack's error?"""

from __future__ import annotations

import argparse

import torch

from fl_sim.bench.invocation import DATA_HELP, bench_data, command_line, results_folder


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench lavp``."""
    lavp = bench.add_parser(
        "lavp",
        help="do LAVP and the gradient norm forecast the optimisation attack's error? (Spearman)",
    )
    lavp.add_argument(
        "--data",
        required=True,
        help=DATA_HELP,
    )
    lavp.add_argument("--split", choices=("train", "test"), default="test")
    lavp.add_argument("--samples", type=int, default=100, help="images, each a batch of one")
    lavp.add_argument("--width", type=int, default=100)
    lavp.add_argument("--depth", type=int, default=6)
    lavp.add_argument("--losses", default="l2,cosine", help="attack losses, comma-separated")
    lavp.add_argument("--iterations", type=int, default=500, help="attack steps per image")
    lavp.add_argument("--restarts", type=int, default=1)
    lavp.add_argument("--lr", type=float, default=0.1)
    lavp.add_argument("--tv", type=float, default=1e-4, help="total-variation weight")
    lavp.add_argument("--chunk", type=int, default=25, help="images inverted at once")
    lavp.add_argument("--proxy-tol", type=float, default=1e-8)
    lavp.add_argument("--proxy-max-iter", type=int, default=300)
    lavp.add_argument("--seed", type=int, default=0)
    lavp.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    lavp.add_argument("--out", help="results folder (default: bench/runs/lavp-TIME)")
    lavp.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from fl_sim.bench.lavp import LavpPlan, run_lavp_bench

    if args.threads is not None:
        # On a shared machine one thread per process avoids OpenMP's spinning threads, which
        # measured 3x slower than one thread on 2 oversubscribed cores.
        torch.set_num_threads(args.threads)
    try:
        plan = LavpPlan(
            samples=args.samples,
            width=args.width,
            depth=args.depth,
            losses=tuple(args.losses.split(",")),
            iterations=args.iterations,
            restarts=args.restarts,
            lr=args.lr,
            tv=args.tv,
            chunk=args.chunk,
            proxy_tol=args.proxy_tol,
            proxy_max_iter=args.proxy_max_iter,
            seed=args.seed,
        )
    except ValueError as err:
        raise SystemExit(f"fl-sim bench lavp: {err}") from None
    data = bench_data(args.data, args.split)
    out = results_folder(args.out, "lavp")
    run_lavp_bench(plan, data, out, command=command_line())
    print((out / "summary.md").read_text())
    print(f"results in {out}/ (summary.md, summary.json, rows.jsonl, scatter.png)")
    return 0
