"""``fl-sim attack``: SPEAR++ on a first-layer update saved anywhere."""

from __future__ import annotations

import argparse
from pathlib import Path

from attacks import SpearConfig
from fl_sim.cli.errors import BadInput


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim attack``."""
    attack_file = sub.add_parser(
        "attack",
        help="SPEAR++ on an update saved anywhere (.npz: weight, bias and grad_weight, grad_bias "
        "or weight_after, bias_after, lr)",
    )
    attack_file.add_argument("update", help="the .npz file of the first layer's update")
    attack_file.add_argument("--out", help="results folder (default: UPDATE-attack beside it)")
    attack_file.add_argument("--device", default="auto", help="auto (CUDA if any), cpu, cuda")
    attack_file.add_argument(
        "--time-budget", type=float, help="seconds after which no new search pass starts"
    )
    attack_file.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from attacks import AttackInputError
    from fl_sim.saved_update import UpdateFileError, attack_update, read_update

    path = Path(args.update)
    out = Path(args.out) if args.out else path.with_name(f"{path.stem}-attack")
    try:
        update = read_update(path)
        config = SpearConfig(device=args.device, time_budget_s=args.time_budget)
        result = attack_update(update, out, config)
    except (UpdateFileError, AttackInputError) as err:
        raise BadInput(f"fl-sim attack: {path}: {err}") from None
    except ValueError as err:  # a bad --device or --time-budget
        raise BadInput(f"fl-sim attack: {err}") from None
    inferred = result["inferred"]
    print(
        f"{result['status']}: {result['certified']} of {result['batch_size_estimated']} samples "
        f"certified exact (batch size {inferred['batch_size_method']}, confidence "
        f"{inferred['batch_size_confidence']:.2f}) in {result['timings']['attack_s']:.1f} s"
    )
    if inferred["noise_note"]:
        print(f"noise: {inferred['noise_note']}")
    print(f"results in {out}/ ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return 0
