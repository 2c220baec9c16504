"""``fl-sim bench scale``: many clients in Flower's simulation engine, with and without the
audit: wall time and peak memory of the whole process tree.

Each run is ``fl-sim run`` in a child process; the bench samples the memory of that process and
all its descendants (Ray's GCS, raylet and workers, the attack pool) from /proc twice a second.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_sim.bench.invocation import command_line, record_row, results_folder
from fl_sim.bench.machine import machine, measured_header
from fl_sim.proctree import stop_trees, tree_memory
from fl_sim.rundir import AUDIT, DATA, ROUNDS, read_json, read_jsonl

_SAMPLE_S = 0.5


@dataclass(frozen=True)
class ScaleRun:
    """One measured run: a client count, the audit on or off."""

    clients: int
    audit: bool


def measure_command(args: list[str], log: Path, timeout_s: float) -> dict[str, Any]:
    """Run ``args`` to its end (stopped after ``timeout_s``), sampling its tree's memory.

    Returns wall seconds, exit code, the peaks of summed RSS and PSS (bytes) and of the
    process count, PSS per process name at the PSS peak, and the machine's mean load average
    meanwhile.
    """
    peak_rss = peak_pss = peak_procs = 0
    at_peak: dict[str, tuple[int, int]] = {}
    loads = []
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        while proc.poll() is None and time.perf_counter() - started < timeout_s:
            mem = tree_memory(proc.pid)
            if mem.pss > peak_pss:
                at_peak = mem.pss_by_name
            peak_rss, peak_pss = max(peak_rss, mem.rss), max(peak_pss, mem.pss)
            peak_procs = max(peak_procs, mem.processes)
            loads.append(os.getloadavg()[0])
            time.sleep(_SAMPLE_S)
    finally:
        if proc.poll() is None:
            stop_trees([proc.pid])
        proc.wait()
    return {
        # The machine's 1-minute load average, mean over the run: others' work slows it.
        "load_average": sum(loads) / max(1, len(loads)),
        "wall_seconds": time.perf_counter() - started,
        "returncode": proc.returncode,
        "peak_rss_bytes": peak_rss,
        "peak_pss_bytes": peak_pss,
        "peak_processes": peak_procs,
        "peak_pss_by_name": {
            name: {"pss_bytes": pss, "processes": n}
            for name, (pss, n) in sorted(at_peak.items(), key=lambda kv: -kv[1][0])
        },
    }


def run_facts(run_dir: Path) -> dict[str, Any]:
    """What the run directory says: rounds' timing, the audit's records."""
    rounds = read_jsonl(run_dir / ROUNDS)
    audit = read_jsonl(run_dir / AUDIT)
    seconds = [r["seconds"] for r in rounds]
    attack_s = [r["seconds"] for r in audit if r.get("seconds") is not None]
    return {
        "rounds_done": len(rounds) - 1,
        "last_round_at_seconds": seconds[-1] if seconds else None,
        # The first round includes starting Flower's client actors; later ones are warm.
        "first_round_seconds": seconds[1] - seconds[0] if len(seconds) > 1 else None,
        "later_round_seconds_mean": (seconds[-1] - seconds[1]) / (len(seconds) - 2)
        if len(seconds) > 2
        else None,
        "audit_records": len(audit),
        "audit_statuses": dict(Counter(r["status"] for r in audit)),
        "attack_seconds_mean": sum(attack_s) / len(attack_s) if attack_s else None,
        "data": read_json(run_dir / DATA).get("source"),
    }


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The rows as a table, with how and where they were measured."""
    lines = [
        *measured_header(meta),
        f"Scenario `{meta['config']}` ({meta['rounds']} rounds). Wall: the whole `fl-sim run` "
        "(Ray start, rounds, attacks still running after the last round, report). Memory: "
        "peak over samples every 0.5 s of the sums over the run's process tree (the `fl-sim "
        "run` process and every descendant: Ray's GCS, raylet, workers, attack processes) of "
        "RSS and of PSS (shared pages split among the processes that map them), from "
        "/proc/PID/smaps_rollup.",
        "",
        "| clients | audit | wall s | rounds done at s | first round s | later rounds s | "
        "peak PSS GiB | peak RSS GiB | processes | audit records | attack s (mean) | "
        "load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r["audit_statuses"].items()))
        lines.append(
            f"| {r['clients']} | {'on' if r['audit'] else 'off'} | {r['wall_seconds']:.0f} | "
            f"{r['last_round_at_seconds'] or 0:.0f} | {r['first_round_seconds'] or 0:.1f} | "
            f"{r['later_round_seconds_mean'] or 0:.1f} | "
            f"{r['peak_pss_bytes'] / 2**30:.2f} | {r['peak_rss_bytes'] / 2**30:.2f} | "
            f"{r['peak_processes']} | {r['audit_records']} ({statuses or '-'}) | "
            f"{r['attack_seconds_mean'] or 0:.2f} | {r['load_average']:.1f} |"
        )
    lines += ["", "PSS at the peak, per process name (GiB):", ""]
    for r in rows:
        parts = ", ".join(
            f"{name} x{v['processes']} {v['pss_bytes'] / 2**30:.2f}"
            for name, v in r["peak_pss_by_name"].items()
        )
        lines.append(f"- {r['clients']} clients, audit {'on' if r['audit'] else 'off'}: {parts}")
    return "\n".join(lines) + "\n"


def run_scale(
    config: Path,
    runs: list[ScaleRun],
    rounds: int,
    out: Path,
    overrides: list[str],
    command: str,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """Run and measure each of ``runs``; writes ``rows.jsonl``, ``summary.json``,
    ``summary.md`` into ``out`` (rewritten after each run) and keeps the run directories
    under ``out/runs/``."""
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "hardware": machine(),
        "config": str(config),
        "rounds": rounds,
        "overrides": overrides,
        "command": command,
    }
    rows: list[dict[str, Any]] = []
    for run in runs:
        name = f"{run.clients}-clients-audit-{'on' if run.audit else 'off'}"
        run_dir = out / "runs" / name
        sets = [
            f"clients.count={run.clients}",
            f"rounds={rounds}",
            f"audit.enabled={'true' if run.audit else 'false'}",
            *overrides,
        ]
        # run_simulation: the federation in the command's own process tree, which is what is
        # measured (flwr run's SuperLink and simulation run detached from it).
        args = [sys.executable, "-m", "fl_sim.cli", "-q", "run", str(config), "--runtime", "legacy"]
        args += [a for s in sets for a in ("--set", s)] + ["--out", str(run_dir)]
        measured = measure_command(args, out / f"{name}.log", timeout_s)
        row = {"clients": run.clients, "audit": run.audit, **measured, **run_facts(run_dir)}
        record_row(out, row, rows, meta, markdown)
    return rows


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench scale`` on the ``bench`` sub-command parsers."""
    cmd = bench.add_parser(
        "scale", help="many clients in the simulation engine: wall time and peak memory"
    )
    cmd.add_argument("--config", default="configs/scale.toml", help="scenario file")
    cmd.add_argument("--clients", default="100", help="comma-separated client counts")
    cmd.add_argument("--rounds", type=int, default=5)
    cmd.add_argument(
        "--audit", choices=("both", "on", "off"), default="both", help="runs with the audit"
    )
    cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    cmd.add_argument("--timeout", type=float, default=7200.0, help="seconds per run")
    cmd.add_argument("--out", help="results folder (default: bench/runs/scale-TIME)")
    cmd.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from fl_sim.config import ConfigError, load_scenario

    audits = {"both": (False, True), "on": (True,), "off": (False,)}[args.audit]
    runs = [ScaleRun(int(n), a) for n in args.clients.split(",") for a in audits]
    try:  # every run's settings, checked before the first starts
        for run in runs:
            load_scenario(Path(args.config), [f"clients.count={run.clients}", *args.set])
    except ConfigError as err:
        raise SystemExit(f"fl-sim bench scale: {err}") from None
    out = results_folder(args.out, "scale")
    rows = run_scale(
        Path(args.config), runs, args.rounds, out, args.set, command_line(), args.timeout
    )
    print((out / "summary.md").read_text())
    failed = [r for r in rows if r["returncode"] != 0]
    for r in failed:
        name = f"{r['clients']}-clients-audit-{'on' if r['audit'] else 'off'}"
        print(f"run {name} exited with {r['returncode']}: see {out / name}.log")
    return 1 if failed else 0
