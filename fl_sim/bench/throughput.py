"""``fl-sim bench throughput``: reconstructions per minute against the number of attack
workers, through the same executors the audit uses (the local pool, Ray tasks).

Each job is one client's FedSGD update of real CIFAR-10 images (as in ``fl-sim bench attack``).
Every executor first runs one job per worker unmeasured (process start, imports, Ray worker
start-up), then the measured batch: all jobs submitted at once, timed until the last outcome.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks import ATTACKS, ServerView, SpearConfig
from fl_sim.audit.job import AttackJob, AttackOutcome, write_arrays
from fl_sim.bench.attack import client_update
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.invocation import bench_data, command_line, record_row, results_folder
from fl_sim.bench.machine import machine, measured_header
from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization
from fl_sim.executors import EXECUTORS
from fl_sim.executors.cluster import ClusterSpec
from fl_sim.proctree import tree_cpu_seconds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThroughputPlan:
    """What to measure.

    Parameters
    ----------
    case
        The client update every job attacks (one seed per job).
    jobs
        Measured reconstructions per executor and worker count.
    executors
        Executor names (``pool``, ``ray``).
    workers
        Worker counts to try.
    cluster
        Ray address and per-task resources (``ray`` only).
    """

    case: AttackCase
    jobs: int
    executors: tuple[str, ...]
    workers: tuple[int, ...]
    cluster: ClusterSpec


def write_jobs(case: AttackCase, seeds: range, data: ImageSet, folder: Path) -> list[AttackJob]:
    """One attack job per seed: the update's arrays in ``folder``, the attacker not told B."""
    jobs = []
    for seed in seeds:
        update, _, _ = client_update(case, seed, data, Normalization(), torch.float64)
        view = ServerView(
            weights={"weight": update["weight"].numpy(), "bias": update["bias"].numpy()},
            gradient={"weight": update["grad_weight"].numpy(), "bias": update["grad_bias"].numpy()},
            first_layer=("weight", "bias"),
        )
        config = case.attack.replace(seed=seed)
        jobs.append(
            AttackJob(
                server_round=1,
                client=seed,
                run="spearpp",
                attack=ATTACKS["spearpp"],
                arrays=write_arrays(folder / f"job-{seed}.npz", view.weights, view.gradient),
                view=ServerView({}, {}, view.first_layer),
                config=config,
                peak_bytes=ATTACKS["spearpp"].peak_bytes(view, config),
            )
        )
    return jobs


def measure(
    executor_name: str,
    workers: int,
    cluster: ClusterSpec,
    warm: list[AttackJob],
    jobs: list[AttackJob],
) -> dict[str, Any]:
    """Warm-up (unmeasured start-up) and the measured batch on one executor."""
    executor = EXECUTORS[executor_name](workers, cluster)
    outcomes: list[AttackOutcome] = []
    errors: list[str] = []
    try:
        started = time.perf_counter()
        for job in warm[:workers]:
            executor.submit(job, lambda _: None, lambda e: errors.append(repr(e)))
        executor.wait(3600.0)
        startup = time.perf_counter() - started
        started, cpu = time.perf_counter(), tree_cpu_seconds(os.getpid())
        for job in jobs:
            executor.submit(job, outcomes.append, lambda e: errors.append(repr(e)))
        executor.wait(3600.0)
        seconds = time.perf_counter() - started
        # This process and its descendants: the pool's workers, or the local Ray's.
        cpu = tree_cpu_seconds(os.getpid()) - cpu
    finally:
        executor.close()
    return {
        "executor": executor_name,
        "workers": workers,
        "jobs": len(jobs),
        "warm_up_seconds": startup,
        "seconds": seconds,
        "per_minute": 60.0 * len(outcomes) / seconds,
        "attack_seconds_mean": float(np.mean([o.seconds for o in outcomes])) if outcomes else None,
        "cpu_seconds_per_attack": cpu / len(jobs),
        "statuses": dict(Counter(o.summary["status"] for o in outcomes)),
        "errors": errors,
        "devices": sorted({o.summary["settings"]["device_used"] for o in outcomes}),
        # Other work on the machine slows every row alike: the 1-minute load average after it.
        "load_average": os.getloadavg()[0],
    }


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The rows as a table, with how and where they were measured."""
    lines = [
        *measured_header(meta),
        f"Each job: {meta['case']} on real CIFAR-10 images (`{meta['data']}`), one seed per "
        f"job, the attacker not told B; {meta['jobs']} jobs measured per row, after one "
        "unmeasured warm-up job per worker (worker start-up). Ray tasks reserve "
        f"{meta['attack_cpus']} CPU each and use that many torch threads; pool workers use "
        "cores // workers threads each.",
        "",
        "CPU s per attack: CPU time of this process and all its descendants (the pool's "
        "workers, or the local Ray's raylet and workers) during the measured batch, over the "
        "jobs: what one reconstruction costs whatever else runs on the machine.",
        "",
        "| executor | workers | reconstructions / min | wall s | s per attack (mean) | "
        "CPU s per attack | warm-up s | statuses | load average |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        if r["errors"]:
            statuses += f", errors {len(r['errors'])}"
        lines.append(
            f"| {r['executor']} | {r['workers']} | {r['per_minute']:.1f} | {r['seconds']:.1f} | "
            f"{r['attack_seconds_mean'] or 0:.2f} | {r['cpu_seconds_per_attack']:.2f} | "
            f"{r['warm_up_seconds']:.1f} | {statuses} | "
            f"{r['load_average']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def run_throughput(
    plan: ThroughputPlan, data: ImageSet, out: Path, command: str
) -> list[dict[str, Any]]:
    """Measure every executor and worker count; writes ``rows.jsonl``, ``summary.json`` and
    ``summary.md`` into ``out`` (rewritten after each row)."""
    import ray

    out.mkdir(parents=True, exist_ok=True)
    most = max(plan.workers)
    jobs = write_jobs(plan.case, range(most, most + plan.jobs), data, out / "jobs")
    warm = write_jobs(plan.case, range(most), data, out / "jobs")
    meta: dict[str, Any] = {
        "hardware": machine(),
        "case": plan.case.name,
        "data": data.source,
        "jobs": plan.jobs,
        "attack_cpus": plan.cluster.attack_cpus,
        "command": command,
    }
    rows: list[dict[str, Any]] = []
    try:
        if "ray" in plan.executors:
            # One connection for every row, so each row's warm-up is its workers' start only.
            ray.init(
                address=plan.cluster.ray_address(),
                include_dashboard=False,
                logging_level=logging.ERROR,
                log_to_driver=False,
            )
        for name in plan.executors:
            for workers in plan.workers:
                row = measure(name, workers, plan.cluster, warm, jobs)
                log.info("%s x%d: %.1f reconstructions/min", name, workers, row["per_minute"])
                record_row(out, row, rows, meta, markdown)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for job in (*warm, *jobs):
            Path(job.arrays).unlink(missing_ok=True)
        (out / "jobs").rmdir()
    return rows


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench throughput`` on the ``bench`` sub-command parsers."""
    cmd = bench.add_parser(
        "throughput", help="reconstructions per minute against attack workers (pool, Ray)"
    )
    cmd.add_argument("--data", required=True, help="CIFAR-10: .npz or folder")
    cmd.add_argument("--executors", default="pool,ray", help="comma-separated executor names")
    cmd.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    cmd.add_argument("--jobs", type=int, default=24, help="measured reconstructions per row")
    cmd.add_argument("--batch-size", type=int, default=20)
    cmd.add_argument("--width", type=int, default=200)
    cmd.add_argument("--depth", type=int, default=6)
    cmd.add_argument(
        "--address", default="", help="Ray cluster (default: $RAY_ADDRESS, else local)"
    )
    cmd.add_argument("--attack-cpus", type=float, default=1.0, help="CPUs per Ray task")
    cmd.add_argument("--attack-gpus", type=float, default=0.0, help="GPUs per Ray task")
    cmd.add_argument("--out", help="results folder (default: bench/runs/throughput-TIME)")
    cmd.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        cluster = ClusterSpec(
            address=args.address, attack_cpus=args.attack_cpus, attack_gpus=args.attack_gpus
        )
        case = AttackCase(
            f"FedSGD B={args.batch_size} m={args.width} depth={args.depth}",
            args.batch_size,
            args.width,
            args.depth,
            attack=SpearConfig(),
        )
        plan = ThroughputPlan(
            case,
            args.jobs,
            tuple(args.executors.split(",")),
            tuple(int(w) for w in args.workers.split(",")),
            cluster,
        )
        unknown = set(plan.executors) - set(EXECUTORS)
        if unknown:
            raise ValueError(f"--executors {args.executors}: allowed are {', '.join(EXECUTORS)}")
    except ValueError as err:
        raise SystemExit(f"fl-sim bench throughput: {err}") from None
    data = bench_data(args.data)
    out = results_folder(args.out, "throughput")
    run_throughput(plan, data, out, command_line())
    print((out / "summary.md").read_text())
    return 0
