"""``fl-sim bench results``: the targets table's rows re-run on demand, and the one results
table (``docs/results.md``) written from their folders."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench results``."""
    results = bench.add_parser(
        "results",
        help="write docs/results.md from bench/results/ (re-running the rows --run names)",
    )
    results.add_argument("--targets", default="bench/targets.toml", help="the rows (TOML)")
    results.add_argument("--results", default="bench/results", help="one folder per row")
    results.add_argument("--out", default="docs/results.md", help="the table written")
    results.add_argument(
        "--run",
        nargs="+",
        default=(),
        metavar="ROW",
        help="re-run these rows first ('all': every one)",
    )
    results.add_argument(
        "--data", help="images for the rows --run runs (as the benches take --data)"
    )
    results.set_defaults(func=_results)


def _results(args: argparse.Namespace) -> int:
    from fl_sim.bench.results import load_targets, render, run_target, stale_folders

    folder = Path(args.results)
    try:
        targets = load_targets(Path(args.targets))
        names = [t.name for t in targets]
        chosen = names if list(args.run) == ["all"] else list(args.run)
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise ValueError(f"--run {' '.join(unknown)}: no such row; rows: {', '.join(names)}")
        for target in targets:
            if target.name in chosen:
                code = run_target(target, folder, args.data)
                if code != 0:
                    raise ValueError(f"row {target.name!r}: its command exited with {code}")
        text = render(targets, folder)
    except (ValueError, KeyError) as err:
        raise SystemExit(f"fl-sim bench results: {err}") from None
    Path(args.out).write_text(text)
    stale = stale_folders(targets, folder)
    if stale:
        print(f"folders no row names (delete, or add a row): {', '.join(stale)}")
    print(f"{args.out}: {len(targets)} rows")
    return 0
