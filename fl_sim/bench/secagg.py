"""``fl-sim bench secagg``: what SPEAR++ recovers from the sum SecAgg+ hands the server.

For each width m, cohort size K and per-client batch size B, K FedSGD clients at the same
initial network each take one step on their own B CIFAR-10 images; their first layers go
through Flower's own SecAgg+ arithmetic (:func:`secagg_sum`: the client mod's weighting,
clipping and stochastic quantisation, the workflow's modular sum and dequantisation) and the
attack gets the averaged update as one gradient of K x B samples, told the quantisation noise
the server can compute (:func:`strategies.quantisation.secagg_noise_std`). The sum protects
where K x B passes the width's batch-size limit. Rows go to ``rows.jsonl`` as they finish;
``secagg.json``, ``secagg.csv`` and ``secagg.png`` are rewritten after each.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common.secure_aggregation.ndarrays_arithmetic import (
    factor_combine,
    factor_extract,
    get_parameters_shape,
    parameters_addition,
    parameters_mod,
    parameters_multiply,
    parameters_subtraction,
)
from flwr.common.secure_aggregation.quantization import dequantize, quantize
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
from matplotlib.figure import Figure
from pydantic import ValidationError

from attacks import SpearConfig, reconstruct
from fl_sim.audit.metrics import match_and_score
from fl_sim.bench.invocation import bench_data, command_line, results_folder
from fl_sim.bench.machine import machine, measured_on
from fl_sim.config.federation import SecAggSpec
from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization
from fl_sim.model import fc_relu_net, first_linear
from strategies import update_as_gradient
from strategies.quantisation import secagg_noise_std

log = logging.getLogger(__name__)

# Largest B attacked exactly on one client's update, per width (bench/results/limits: >= 90%
# of the samples exact over the seeds); beyond twice this the sum is not worth attacking.
KNOWN_LIMITS = {1000: 110, 2000: 180, 4000: 288}
# SecAgg+'s modulus (SecAggPlusWorkflow's modulus_range default): the sum is taken mod it.
MODULUS_RANGE = 2**32


def secagg_sum(
    client_arrays: Sequence[list[np.ndarray]], num_examples: Sequence[int], spec: SecAggSpec
) -> list[np.ndarray]:
    """The weighted average SecAgg+ gives the server for these client arrays, computed with
    Flower's own functions in the order ``secaggplus_mod`` and ``SecAggPlusWorkflow`` apply
    them. Each client's private mask is added and, as the unmask stage does once it has
    recombined the seeds from their shares, removed again; the pairwise masks, which cancel
    between neighbours in the sum, are left out.

    Quantisation is stochastic (NumPy's global generator, as in Flower): seed it for a
    repeatable sum.
    """
    total: list[np.ndarray] | None = None
    seeds = []
    for arrays, n in zip(client_arrays, num_examples, strict=True):
        # The client's side (flwr/client/mod/secure_aggregation/secaggplus_mod.py, stage 2).
        q_ratio = round(n / spec.max_weight * spec.quantization_range)
        weighted = parameters_multiply(arrays, q_ratio / spec.quantization_range)
        quantised = quantize(weighted, spec.clipping_range, spec.quantization_range)
        vector = factor_combine(q_ratio, quantised)
        seeds.append(os.urandom(32))
        mask = pseudo_rand_gen(seeds[-1], MODULUS_RANGE, get_parameters_shape(vector))
        vector = parameters_mod(parameters_addition(vector, mask), MODULUS_RANGE)
        total = vector if total is None else parameters_addition(total, vector)
    if total is None:
        raise ValueError("no client arrays to sum")
    # The server's side (flwr/server/workflow/secure_aggregation/secaggplus_workflow.py, unmask).
    total = parameters_mod(total, MODULUS_RANGE)
    for seed in seeds:
        mask = pseudo_rand_gen(seed, MODULUS_RANGE, get_parameters_shape(total))
        total = parameters_subtraction(total, mask)
    q_total, summed = factor_extract(parameters_mod(total, MODULUS_RANGE))
    averaged = dequantize(summed, spec.clipping_range, spec.quantization_range)
    offset = -(len(client_arrays) - 1) * spec.clipping_range
    return [(a + offset) * (spec.quantization_range / q_total) for a in averaged]


@dataclass(frozen=True)
class SecAggPlan:
    """The grid: widths x cohort sizes x per-client batch sizes, with their budgets."""

    widths: tuple[int, ...] = (1000, 4000)
    cohorts: tuple[int, ...] = (1, 2, 4, 8, 16)
    batches: tuple[int, ...] = (4, 8, 16, 32, 64)
    depth: int = 6
    lr: float = 1.0
    seed: int = 0
    time_budget_s: float = 30.0
    # Skip K x B beyond this many times the width's known limit (None: attack every point).
    skip_factor: float | None = 2.0
    secagg: SecAggSpec = field(default_factory=SecAggSpec)

    def skip_reason(self, width: int, total: int) -> str | None:
        """Why a point is not attacked ('' never: None when it is)."""
        limit = KNOWN_LIMITS.get(width)
        if self.skip_factor is None or limit is None or total <= self.skip_factor * limit:
            return None
        return (
            f"K x B = {total} > {self.skip_factor:g} x the single-client limit {limit} at "
            f"m={width}: every measured batch there fails"
        )


def cohort_gradient(
    plan: SecAggPlan,
    width: int,
    cohort: int,
    batch: int,
    data: ImageSet,
    norm: Normalization,
) -> tuple[dict[str, np.ndarray], torch.Tensor, float]:
    """The server's view of one cohort's summed first layer (gradient, weights sent) as
    float64 arrays, the cohort's true images on [0, 1] and the gradient's noise std."""
    rng = np.random.default_rng([plan.seed, width, cohort, batch])
    idx = rng.choice(len(data.labels), cohort * batch, replace=False)
    images = torch.from_numpy(data.images[idx]).permute(0, 3, 1, 2).double() / 255
    labels = torch.from_numpy(data.labels[idx]).long()
    torch.manual_seed(plan.seed)
    model = fc_relu_net(width, plan.depth).double()
    _, layer = first_linear(model)
    sent = [layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy()]
    returned = []
    for k in range(cohort):
        part = slice(k * batch, (k + 1) * batch)
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(norm.apply(images[part])), labels[part])
        loss.backward()
        grads = [p.grad.numpy() for p in (layer.weight, layer.bias) if p.grad is not None]
        # FedSGD: one step. Only the first layer goes through SecAgg+ here: quantisation is
        # entry by entry, so the other layers change nothing of what the attack sees.
        returned.append([w - plan.lr * g for w, g in zip(sent, grads, strict=True)])
    np.random.seed(plan.seed)  # Flower's stochastic rounding draws from NumPy's global generator
    averaged = secagg_sum(returned, [batch] * cohort, plan.secagg)
    spec = plan.secagg
    noise = secagg_noise_std(
        [batch] * cohort, spec.clipping_range, spec.quantization_range, spec.max_weight
    )
    view = {
        "grad_weight": update_as_gradient(sent[0], averaged[0], plan.lr),
        "grad_bias": update_as_gradient(sent[1], averaged[1], plan.lr),
        "weight": sent[0],
        "bias": sent[1],
    }
    return view, images, noise / plan.lr


def run_point(
    plan: SecAggPlan, width: int, cohort: int, batch: int, data: ImageSet, norm: Normalization
) -> dict[str, Any]:
    """Attack one point of the grid (or say why not); its row."""
    row: dict[str, Any] = {
        "width": width,
        "cohort": cohort,
        "batch_per_client": batch,
        "samples": cohort * batch,
        "depth": plan.depth,
        "lr": plan.lr,
        "seed": plan.seed,
    }
    skip = plan.skip_reason(width, cohort * batch)
    if skip is not None:
        return {**row, "status": "skipped", "reason": skip}
    start = time.perf_counter()
    view, images, noise_std = cohort_gradient(plan, width, cohort, batch, data, norm)
    built = time.perf_counter() - start
    rec = reconstruct(
        view["grad_weight"],
        view["grad_bias"],
        view["weight"],
        view["bias"],
        noise_std=noise_std,
        config=SpearConfig(time_budget_s=plan.time_budget_s, seed=plan.seed),
    )
    pixels = norm.undo(rec.inputs.reshape(-1, 3, 32, 32))
    quality = match_and_score(pixels, images)
    summary = rec.summary()
    return {
        **row,
        "status": rec.status,
        "noise_std": noise_std,
        "batch_size_estimated": rec.batch_size,
        "columns_found": summary["verified"],
        "share_exact": quality.share_exact,
        "share_near_exact": quality.share_near_exact,
        "psnr_mean": float(quality.psnr.mean()),
        "seconds_build": built,
        "seconds_attack": time.perf_counter() - start - built,
    }


def _plot(rows: list[dict[str, Any]], plan: SecAggPlan, path: Path) -> None:
    """Per width: share near-exact against K x B, one line per cohort size, with the known
    single-client limit marked; skipped points as crosses at 0."""
    fig = Figure(figsize=(6 * len(plan.widths), 4.4))
    axes = fig.subplots(1, len(plan.widths), squeeze=False)[0]
    for ax, width in zip(axes, plan.widths, strict=True):
        for cohort in plan.cohorts:
            mine = [r for r in rows if r["width"] == width and r["cohort"] == cohort]
            done = sorted((r["samples"], r) for r in mine if r["status"] != "skipped")
            if done:
                xs = [n for n, _ in done]
                ax.plot(
                    xs, [100 * r["share_near_exact"] for _, r in done], "o-", label=f"K={cohort}"
                )
                ax.plot(xs, [100 * r["share_exact"] for _, r in done], ".:", color="grey")
            skipped = [r["samples"] for r in mine if r["status"] == "skipped"]
            ax.plot(skipped, [0] * len(skipped), "x", color="lightgrey")
        limit = KNOWN_LIMITS.get(width)
        if limit:
            ax.axvline(limit, color="red", ls="--", label=f"one-client limit B={limit}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("samples in the sum (K clients x B each)")
        ax.set_ylabel("share of samples recovered (%)")
        ax.set_title(f"m={width}: near-exact (lines), exact (grey dots); x = skipped")
        ax.set_ylim(-5, 105)
        ax.legend(fontsize=8)
    fig.suptitle("SPEAR++ on the SecAgg+ sum of K FedSGD clients (Flower's quantisation)")
    fig.savefig(path, dpi=110, bbox_inches="tight")


def _write(rows: list[dict[str, Any]], plan: SecAggPlan, out: Path, meta: dict[str, Any]) -> None:
    (out / "secagg.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "plan": asdict(plan) | {"secagg": plan.secagg.model_dump()},
                "rows": rows,
            },
            indent=2,
        )
    )
    keys = [
        "width", "cohort", "batch_per_client", "samples", "status", "share_exact",
        "share_near_exact", "columns_found", "batch_size_estimated", "noise_std", "psnr_mean",
        "seconds_attack", "reason",
    ]  # fmt: skip
    with (out / "secagg.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    _plot(rows, plan, out / "secagg.png")


def run_secagg_bench(
    plan: SecAggPlan, data: ImageSet, out: Path, command: str = ""
) -> list[dict[str, Any]]:
    """Every point of ``plan`` in order (smallest sums first), results under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    norm = Normalization()
    hw = machine()
    meta = {"command": command, "hardware": hw, "measured_on": measured_on(hw)}
    rows: list[dict[str, Any]] = []
    points = sorted(
        ((w, k, b) for w in plan.widths for k in plan.cohorts for b in plan.batches),
        key=lambda p: (p[0], p[1] * p[2], p[1]),
    )
    for width, cohort, batch in points:
        row = run_point(plan, width, cohort, batch, data, norm)
        log.info(
            "m=%d K=%d B=%d: %s, exact %s, near %s",
            width,
            cohort,
            batch,
            row["status"],
            row.get("share_exact"),
            row.get("share_near_exact"),
        )
        rows.append(row)
        with (out / "rows.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        _write(rows, plan, out, meta)
    return rows


def setting_in_words(plan: dict[str, Any]) -> str:
    """A run's quantisation and budget in words, from its ``secagg.json`` plan."""
    q = plan["secagg"]
    levels = int(q["quantization_range"]).bit_length() - 1
    return (
        f"max_weight {q['max_weight']:g}, 2^{levels} levels, clip +-{q['clipping_range']:g}; "
        f"{plan['time_budget_s']:g} s per attack"
    )


def join_runs(folders: Sequence[Path], out: Path) -> list[dict[str, Any]]:
    """Join ``fl-sim bench secagg`` runs (e.g. one per width and quantisation) into
    ``secagg.csv`` (each row with its run's setting) and ``secagg.png``: one panel per width and
    setting, share near-exact against K x B, a line per cohort size."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for folder in folders:
        run = json.loads((folder / "secagg.json").read_text())
        setting = setting_in_words(run["plan"])
        rows += [{**r, "setting": setting, "run": folder.name} for r in run["rows"]]
    panels = sorted({(r["width"], r["setting"]) for r in rows})
    fig = Figure(figsize=(6.2 * 2, 4.4 * ((len(panels) + 1) // 2)))
    axes = fig.subplots((len(panels) + 1) // 2, 2, squeeze=False).ravel()
    for ax, (width, setting) in zip(axes, panels, strict=False):
        mine = [r for r in rows if r["width"] == width and r["setting"] == setting]
        for cohort in sorted({r["cohort"] for r in mine}):
            done = sorted(
                (r["samples"], 100 * r["share_near_exact"])
                for r in mine
                if r["cohort"] == cohort and r["status"] != "skipped"
            )
            if done:
                ax.plot(*zip(*done, strict=True), "o-", label=f"K={cohort} clients")
        skipped = [r["samples"] for r in mine if r["status"] == "skipped"]
        ax.plot(skipped, [0] * len(skipped), "x", color="grey", label="skipped (> 2x limit)")
        limit = KNOWN_LIMITS.get(width)
        if limit:
            ax.axvline(limit, color="red", ls="--", label=f"one-client limit B={limit}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-5, 105)
        ax.set_xlabel("samples in the sum (K clients x B each)")
        ax.set_ylabel("near-exact samples (>= 40 dB, %)")
        ax.set_title(f"m={width}: {setting}", fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle("SPEAR++ on the SecAgg+ sum of K FedSGD clients (Flower's quantisation)")
    fig.savefig(out / "secagg.png", dpi=110, bbox_inches="tight")
    # Every key any row has, in order of first appearance, the run's name and setting first.
    keys = list(dict.fromkeys(["run", "setting", *(k for r in rows for k in r)]))
    with (out / "secagg.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench secagg`` on the ``bench`` sub-command parsers."""
    cmd = bench.add_parser(
        "secagg", help="SPEAR++ on the SecAgg+ sum: cohort size x batch size, per width"
    )
    cmd.add_argument("--data", help="CIFAR-10: .npz or folder (required unless --join)")
    cmd.add_argument("--split", choices=("train", "test"), default="test")
    cmd.add_argument("--widths", default="1000,4000", help="comma-separated m")
    cmd.add_argument("--cohorts", default="1,2,4,8,16", help="clients summed, comma-separated")
    cmd.add_argument("--batches", default="4,8,16,32,64", help="B per client, comma-separated")
    cmd.add_argument("--depth", type=int, default=6)
    cmd.add_argument("--lr", type=float, default=1.0, help="the FedSGD clients' step")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--time-budget", type=float, default=30.0, help="seconds per attack")
    cmd.add_argument(
        "--skip-factor",
        type=float,
        default=2.0,
        help="skip K x B above this many times the width's single-client limit (0: none)",
    )
    defaults = SecAggSpec()
    cmd.add_argument("--clipping-range", type=float, default=defaults.clipping_range)
    cmd.add_argument("--quantization-range", type=int, default=defaults.quantization_range)
    cmd.add_argument("--max-weight", type=float, default=defaults.max_weight)
    cmd.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    cmd.add_argument("--out", help="results folder (default: bench/runs/secagg-TIME)")
    cmd.add_argument(
        "--join",
        nargs="+",
        metavar="RUN",
        help="instead of running: join these runs' results into --out (one plot, one CSV)",
    )
    cmd.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.join:
        if not args.out:
            raise SystemExit("fl-sim bench secagg --join: name the joined folder with --out")
        join_runs([Path(f) for f in args.join], Path(args.out))
        print(f"joined {len(args.join)} runs in {args.out}/ (secagg.csv, secagg.png)")
        return 0
    try:
        plan = SecAggPlan(
            widths=_ints(args.widths),
            cohorts=_ints(args.cohorts),
            batches=_ints(args.batches),
            depth=args.depth,
            lr=args.lr,
            seed=args.seed,
            time_budget_s=args.time_budget,
            skip_factor=args.skip_factor or None,
            secagg=SecAggSpec(
                clipping_range=args.clipping_range,
                quantization_range=args.quantization_range,
                max_weight=args.max_weight,
            ),
        )
    except (ValueError, ValidationError) as err:
        raise SystemExit(f"fl-sim bench secagg: {err}") from None
    if not args.data:
        raise SystemExit("fl-sim bench secagg: --data is required (CIFAR-10: .npz or folder)")
    torch.set_num_threads(args.threads)
    out = results_folder(args.out, "secagg")
    run_secagg_bench(plan, bench_data(args.data, args.split), out, command_line())
    print((out / "secagg.csv").read_text())
    print(f"results in {out}/ (secagg.json, secagg.csv, secagg.png, rows.jsonl)")
    return 0
