"""``fl-sim bench malicious``: one scenario under each server behaviour, set side by side.

Each behaviour is ``fl-sim run`` of the same scenario and seed in a child process (its run
directory under ``runs/``), then ``fl-sim compare`` of them all against the honest run: the
shares recovered, the most exposed client, the accuracy each behaviour costs and how often the
clients' own check of the model they received fired (:mod:`fl_sim.report.compare`).
``malicious.json`` records the command, the machine and each run's exit status. Of each run
directory only the records are kept (the scenario, data, rounds, clients and audit), unless
``--keep-runs``: a model of a wide first layer is tens of MB, too much for a results folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fl_sim.bench.invocation import command_line, results_folder
from fl_sim.bench.machine import machine
from fl_sim.report.compare import compare_runs, table, write_comparison
from fl_sim.rundir import AUDIT, CLIENTS, DATA, ROUNDS, SCENARIO

RUNS = "runs"
HONEST = "honest"
# What a run directory keeps here: what ``fl-sim compare`` reads, and the data it ran on.
RECORDS = frozenset({SCENARIO, DATA, ROUNDS, CLIENTS, AUDIT})


def behaviours_run(behaviours: Sequence[str]) -> list[str]:
    """The behaviours to run, the honest one first.

    Raises
    ------
    ValueError
        When ``behaviours`` has no dishonest one or names one twice.
    """
    if len(set(behaviours)) != len(behaviours):
        raise ValueError(f"--behaviours {','.join(behaviours)}: a behaviour named twice")
    others = [b for b in behaviours if b != HONEST]
    if not others:
        raise ValueError("--behaviours: name at least one besides honest (it always runs)")
    return [HONEST, *others]


def overrides_of(behaviour: str, overrides: Sequence[str], data: str | None) -> list[str]:
    """The scenario's KEY=VALUE settings for ``behaviour``'s run: ``overrides``, then CIFAR-10
    from ``data`` where given, then the behaviour."""
    sets = [*overrides]
    if data is not None:
        sets += ["data.source=cifar10", f"data.cifar10_dir={data}"]
    return [*sets, f"server.behaviour={behaviour}"]


def run_command(config: Path, sets: Sequence[str], run_dir: Path) -> list[str]:
    """``fl-sim run`` of ``config`` with ``sets`` into ``run_dir``, as a child process."""
    args = [sys.executable, "-m", "fl_sim.cli", "-q", "run", str(config)]
    for value in sets:
        args += ["--set", value]
    return [*args, "--out", str(run_dir)]


def keep_records(run_dir: Path) -> None:
    """Remove from ``run_dir`` everything but its :data:`RECORDS`."""
    for path in run_dir.iterdir():
        if path.name in RECORDS:
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench malicious`` on the ``bench`` sub-command parsers."""
    cmd = bench.add_parser(
        "malicious",
        help="one scenario under each server behaviour against the honest one (fl-sim compare)",
    )
    cmd.add_argument("--config", default="configs/malicious.toml", help="scenario file")
    cmd.add_argument(
        "--behaviours",
        default="sparsify,trap",
        help="comma-separated server behaviours beside honest, which always runs",
    )
    cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    cmd.add_argument("--data", help="CIFAR-10 (.npz or folder; default: the scenario's data)")
    cmd.add_argument("--out", help="results folder (default: bench/runs/malicious-TIME)")
    cmd.add_argument(
        "--keep-runs", action="store_true", help="keep whole run directories, not their records"
    )
    cmd.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from fl_sim.config import ConfigError, load_scenario

    config = Path(args.config)
    out = results_folder(args.out, "malicious")
    try:
        behaviours = behaviours_run([b.strip() for b in args.behaviours.split(",") if b.strip()])
        sets = {b: overrides_of(b, args.set, args.data) for b in behaviours}
        for values in sets.values():  # every run's settings, checked before the first starts
            load_scenario(config, values)
    except (ValueError, ConfigError) as err:
        raise SystemExit(f"fl-sim bench malicious: {err}") from None
    out.mkdir(parents=True, exist_ok=True)
    exits = {}
    for behaviour, values in sets.items():
        started = time.perf_counter()
        command = run_command(config, values, out / RUNS / behaviour)
        exits[behaviour] = subprocess.run(command, check=False).returncode
        print(f"{behaviour}: exit {exits[behaviour]} in {time.perf_counter() - started:.0f} s")
    meta = {"command": command_line(), "hardware": machine(), "exits": exits}
    (out / "malicious.json").write_text(json.dumps(meta, indent=2) + "\n")
    if any(exits.values()):
        print(f"a run failed (exit statuses: {exits}); see its run.log under {out / RUNS}")
        return 1
    runs = compare_runs(out / RUNS / HONEST, [out / RUNS / b for b in behaviours[1:]])
    write_comparison(runs, out)
    if not args.keep_runs:
        for behaviour in behaviours:
            keep_records(out / RUNS / behaviour)
    print(table(runs))
    return 0
