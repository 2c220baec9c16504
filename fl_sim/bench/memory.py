"""``fl-sim bench memory``: each attack's estimated peak memory against the peak its worker
measures, as the audit runs it.

Each case is one client's FedSGD update of real CIFAR-10 images (as in ``fl-sim bench attack``),
in the client's precision, handed over as the audit hands it (float64 arrays), attacked with the
audit's default ``[audit.spearpp]`` settings in a fresh worker of the audit's own pool (its
torch threads as with one worker on this machine). The worker's peak is its resident memory's
high-water mark over the job (``VmHWM`` after ``clear_refs``), idle worker included; the
estimates are its worker's peak as the audit's memory budget counts it, with the batch size
declared and without.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

import torch

from attacks import ATTACKS, ServerView
from fl_sim.audit.job import AttackJob, AttackOutcome, write_arrays
from fl_sim.bench.attack import client_update
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.invocation import bench_data, command_line, record_row, results_folder
from fl_sim.bench.machine import machine, measured_header
from fl_sim.config.schema import AuditSpec
from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization
from fl_sim.executors import ClusterSpec, PoolExecutor
from fl_sim.executors.budget import GB, worker_peak_gb

LAYER = ("weight", "bias")


def _view(case: AttackCase, dtype: torch.dtype, data: ImageSet, seed: int) -> ServerView:
    """The first layer's update of ``case`` in the client's ``dtype``, as the audit hands it."""
    update, _, _ = client_update(case, seed, data, Normalization(), dtype)
    return ServerView(
        weights={
            "weight": update["weight"].double().numpy(),
            "bias": update["bias"].double().numpy(),
        },
        gradient={
            "weight": update["grad_weight"].double().numpy(),
            "bias": update["grad_bias"].double().numpy(),
        },
        first_layer=LAYER,
    )


def _run_in_fresh_worker(job: AttackJob, timeout_s: float) -> AttackOutcome | BaseException:
    pool = PoolExecutor(1, ClusterSpec())
    got: list[AttackOutcome | BaseException] = []
    done = threading.Event()

    def keep(result: AttackOutcome | BaseException) -> None:
        got.append(result)
        done.set()

    try:
        pool.submit(job, keep, keep)
        if not done.wait(timeout_s):
            return TimeoutError(f"not done in {timeout_s:.0f} s")
    finally:
        pool.close()
    return got[0]


def measure(
    batch_size: int, width: int, dtype: str, data: ImageSet, folder: Path, seed: int
) -> dict[str, Any]:
    """One case: the estimates and the measured peak."""
    case = AttackCase(f"B={batch_size} m={width}", batch_size, width, depth=2)
    view = _view(case, getattr(torch, dtype), data, seed)
    plugin = ATTACKS["spearpp"]
    config = plugin.config(AuditSpec().table("spearpp"), None, seed)
    unknown = plugin.peak_bytes(view, config)
    declared = plugin.peak_bytes(
        ServerView(view.weights, view.gradient, LAYER, batch_size=batch_size), config
    )
    arrays = write_arrays(
        folder / f"B{batch_size}-m{width}-{dtype}.npz", view.weights, view.gradient
    )
    job = AttackJob(1, 0, "spearpp", plugin, arrays, ServerView({}, {}, LAYER), config, unknown)
    outcome = _run_in_fresh_worker(job, 3600.0)
    Path(arrays).unlink(missing_ok=True)
    row: dict[str, Any] = {
        "batch_size": batch_size,
        "width": width,
        "client_dtype": dtype,
        "estimate_declared_gb": worker_peak_gb(declared),
        "estimate_unknown_gb": worker_peak_gb(unknown),
    }
    if isinstance(outcome, BaseException):
        return {**row, "error": repr(outcome), "peak_gb": None}
    peak = outcome.memory_peak_bytes
    return {
        **row,
        "peak_gb": round(peak / GB, 3) if peak is not None else None,
        "status": outcome.summary.get("status"),
        "seconds": round(outcome.seconds, 1),
    }


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The rows as a table, with how and where they were measured."""
    lines = [
        *measured_header(meta),
        "Each row: one FedSGD update of real CIFAR-10 images (n = 3072, depth 2, seed "
        f"{meta['seed']}), attacked by SPEAR++ with the audit's default settings in a fresh "
        "worker of the audit's pool. Peak: the worker's resident memory at its highest during "
        "the job, the idle worker included. Estimates: the worker's peak as the audit's memory "
        "budget counts it (`audit.max_memory_gb`), with the batch size declared and not; the "
        "budget is safe where each estimate is at least the peak.",
        "",
        "| B | m | client | peak GB | estimate, B declared | estimate, B unknown | "
        "declared / peak | status | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = r["peak_gb"]
        ratio = f"{r['estimate_declared_gb'] / peak:.2f}" if peak else "-"
        lines.append(
            f"| {r['batch_size']} | {r['width']} | {r['client_dtype']} | "
            f"{peak if peak is not None else r.get('error')} | {r['estimate_declared_gb']:.2f} | "
            f"{r['estimate_unknown_gb']:.2f} | {ratio} | {r.get('status', '-')} | "
            f"{r.get('seconds', '-')} |"
        )
    return "\n".join(lines) + "\n"


def run_memory(
    cases: list[tuple[int, int, str]], data: ImageSet, out: Path, command: str, seed: int
) -> list[dict[str, Any]]:
    """Measure every case; ``rows.jsonl``, ``summary.json`` and ``summary.md`` in ``out``,
    rewritten after each case."""
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "hardware": machine(),
        "data": data.source,
        "seed": seed,
        "command": command,
    }
    rows: list[dict[str, Any]] = []
    for batch_size, width, dtype in cases:
        record_row(out, measure(batch_size, width, dtype, data, out, seed), rows, meta, markdown)
    return rows


def _cases(text: str) -> list[tuple[int, int, str]]:
    """``B:m:dtype,...`` parsed."""
    cases = []
    for item in text.split(","):
        parts = item.split(":")
        if len(parts) != 3 or parts[2] not in ("float64", "float32"):
            raise ValueError(f"--cases {item!r}: B:m:dtype with dtype float64 or float32")
        cases.append((int(parts[0]), int(parts[1]), parts[2]))
    return cases


DEFAULT_CASES = (
    "100:1000:float64,256:1000:float64,512:1000:float64,100:4000:float64,"
    "256:4000:float64,512:4000:float64,256:4000:float32,512:4000:float32"
)


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench memory`` on the ``bench`` sub-command parsers."""
    cmd = bench.add_parser(
        "memory", help="each attack's estimated peak memory against its worker's measured peak"
    )
    cmd.add_argument("--data", required=True, help="CIFAR-10: .npz or folder")
    cmd.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated B:m:dtype")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--out", help="results folder (default: bench/runs/memory-TIME)")
    cmd.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    try:
        cases = _cases(args.cases)
    except ValueError as err:
        raise SystemExit(f"fl-sim bench memory: {err}") from None
    data = bench_data(args.data)
    out = results_folder(args.out, "memory")
    run_memory(cases, data, out, command_line(), args.seed)
    print((out / "summary.md").read_text())
    return 0
