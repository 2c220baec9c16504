"""``fl-sim bench reach``: what limits the sign search past the batch-size limit (a judge's tool).

Ground truth enters here only: the true columns of Q and the true input coordinates P = Q^-1
are computed from the client's batch, in the attack's own coordinates. Three measurements per
batch:

- fixed points: the true columns that the sign iteration leaves in place (a column that is not
  one is found only by the deflated or complement searches);
- basins: the share of true columns that the iteration brings back from starts 10 and 20
  degrees away;
- deflated rounds: rounds of random starts, each round deflating the columns found so far
  (exactly as the engine's sign rounds do, without refinement or verification: a point counts
  where it lies within 0.999 cosine of a true column) with the found samples' input
  coordinates either estimated as the engine estimates them (max-margin fits to their zero
  patterns) or exact (the truth: the deflation the estimates stand in for), and the sign
  iterations' last ones free of the deflation as many as the engine runs or as
  ``free_iterations`` says. The angle between estimate and truth is recorded per round.

Rows go to ``rows.jsonl`` as each batch finishes; ``summary.md`` is rewritten after each.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attacks import SpearConfig
from attacks.spearpp.factor import factorise
from attacks.spearpp.inputs import PRECISION_FLOOR
from attacks.spearpp.signs import (
    FREE_ITERATIONS,
    SignGeometry,
    consistent_inputs,
    fit_inputs,
    sign_search,
)
from fl_sim.bench.attack import client_update
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.machine import hardware, measured_on
from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization

# A point within this cosine of a true column is on it (refinement takes it the rest of the way).
ON_COLUMN = 0.999
# Angles (degrees) of the basin probes.
BASIN_ANGLES = (10, 20)
# Entries of a true column at most this share of its largest are its zeros (float64 gradients).
_ZERO = 1e-10
# Starts per sign_search call: bounds the memory of one call.
_CHUNK = 50
INPUTS = ("estimated", "exact")
# The engine's sign iterations per start.
_ITERATIONS = SpearConfig().sign_iterations


@dataclass(frozen=True)
class Truth:
    """A batch seen by the judge in the attack's search coordinates.

    Attributes
    ----------
    geom
        The attack's factorisation views.
    columns
        B x B true columns of Q (unit rows).
    inputs
        B x B true input coordinates (rows of Q^-1).
    zero
        m x B: the true columns' zeros.
    """

    geom: SignGeometry
    columns: torch.Tensor
    inputs: torch.Tensor
    zero: torch.Tensor


def truth_of(view: dict[str, torch.Tensor], images: torch.Tensor, norm: Normalization) -> Truth:
    """The true columns and inputs of a float64 FedSGD update ``view`` of ``images``."""
    grad = view["grad_weight"].double()
    x = norm.apply(images.double()).flatten(1)
    per_sample = grad @ torch.linalg.pinv(x)  # m x B: each sample's output gradient
    b = images.shape[0]
    fac = factorise(
        grad,
        batch_size=b,
        noise_std=None,
        precision=PRECISION_FLOOR,
        generator=torch.Generator().manual_seed(0),
    )
    geom = SignGeometry.build(fac.left, fac.right, view["weight"].double(), view["bias"].double())
    engine = torch.nn.functional.normalize((fac.left.T @ per_sample).T, dim=1)
    columns = geom.to_search(engine)
    zero = per_sample.abs() <= _ZERO * per_sample.abs().amax(0, keepdim=True)
    return Truth(geom, columns, torch.linalg.inv(columns.T), zero)


def _search(truth: Truth, starts: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    parts = [
        sign_search(truth.geom, starts[i : i + _CHUNK], iterations=_ITERATIONS, **kwargs)
        for i in range(0, starts.shape[0], _CHUNK)
    ]
    return torch.nn.functional.normalize(torch.cat(parts), dim=1)


def landed(truth: Truth, points: torch.Tensor) -> torch.Tensor:
    """Index of the true column each point lies on, -1 where none."""
    cos, idx = (points @ truth.columns.T).abs().max(dim=1)
    return torch.where(cos > ON_COLUMN, idx, torch.full_like(idx, -1))


def fixed_points(truth: Truth) -> torch.Tensor:
    """Mask of the true columns that the undeflated sign iteration returns to themselves."""
    return landed(truth, _search(truth, truth.columns, deflation=None)) == torch.arange(
        truth.columns.shape[0]
    )


def basin_share(truth: Truth, degrees: float, generator: torch.Generator) -> float:
    """Share of true columns the iteration brings back from a start ``degrees`` away."""
    q = truth.columns
    away = torch.randn(q.shape, generator=generator, dtype=q.dtype)
    away = torch.nn.functional.normalize(away - (away * q).sum(1, keepdim=True) * q, dim=1)
    angle = math.radians(degrees)
    starts = math.cos(angle) * q + math.sin(angle) * away
    back = landed(truth, _search(truth, starts, deflation=None)) == torch.arange(q.shape[0])
    return float(back.double().mean())


def _angles(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    cos = (torch.nn.functional.normalize(a, dim=1) * torch.nn.functional.normalize(b, dim=1)).sum(1)
    return torch.rad2deg(torch.arccos(cos.abs().clamp(max=1.0)))


def estimated_inputs(truth: Truth, found: torch.Tensor) -> torch.Tensor:
    """The found samples' input coordinates (F x B) as the engine's sign rounds estimate them:
    max-margin fits to their zero patterns, made consistent with the found columns."""
    active = ~truth.zero[:, found].T
    fits = fit_inputs(truth.geom.affine(), active)[:, : truth.columns.shape[0]]
    return consistent_inputs(truth.columns[found], fits)


def deflated_rounds(
    truth: Truth,
    inputs: str,
    per_round: int,
    patience: int,
    generator: torch.Generator,
    free_iterations: int = FREE_ITERATIONS,
) -> list[dict[str, float | None]]:
    """Rounds of ``per_round`` random starts deflating the columns found so far, until
    ``patience`` rounds in a row find none or all are found; per round, the columns found and
    the median angle (degrees) between the deflation's input coordinates and the truth (None
    before any column is found). ``inputs``: one of :data:`INPUTS`."""
    if inputs not in INPUTS:
        raise ValueError(f"inputs={inputs!r}: allowed are {', '.join(INPUTS)}")
    b = truth.columns.shape[0]
    found = torch.zeros(b, dtype=torch.bool)
    history: list[dict[str, float | None]] = []
    idle = 0
    while idle < patience and not bool(found.all()):
        index = found.nonzero().flatten()
        deflation = columns = None
        error = None
        if len(index):
            columns = truth.columns[index]
            coords = truth.inputs[index] if inputs == "exact" else estimated_inputs(truth, index)
            deflation = torch.linalg.qr(coords.T).Q
            error = float(_angles(coords, truth.inputs[index]).median())
        starts = torch.nn.functional.normalize(
            torch.randn(per_round, b, generator=generator, dtype=torch.float64), dim=1
        )
        hit = landed(
            truth,
            _search(
                truth, starts, deflation=deflation, found=columns, free_iterations=free_iterations
            ),
        )
        new = torch.zeros(b, dtype=torch.bool)
        new[hit[hit >= 0]] = True
        idle = 0 if bool((new & ~found).any()) else idle + 1
        found |= new
        history.append({"found": int(found.sum()), "input_error_deg": error})
    return history


def diagnose(
    case: AttackCase,
    seed: int,
    data: ImageSet,
    per_round: int,
    patience: int,
    free_iterations: tuple[int, ...] = (),
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every measurement of one batch (float64 client); the row of results. The deflated
    rounds run with the engine's free iterations and each of ``free_iterations``."""
    norm = Normalization()
    view, images, _ = client_update(case, seed, data, norm, torch.float64)
    truth = truth_of(view, images, norm)
    generator = torch.Generator().manual_seed(seed)
    fixed = fixed_points(truth)
    zeros = truth.zero.sum(0)
    row: dict[str, Any] = {
        "batch_size": case.batch_size,
        "width": case.width,
        "depth": case.depth,
        "seed": seed,
        "pretrain_steps": case.pretrain.steps,
        "fixed_points": int(fixed.sum()),
        "zeros_median": float(zeros.double().median()),
        "zeros_of_non_fixed": sorted(int(z) for z in zeros[~fixed]),
        "basins": {f"{a} deg": basin_share(truth, a, generator) for a in BASIN_ANGLES},
    }
    progress(f"seed {seed}: {row['fixed_points']} of {case.batch_size} columns fixed points")
    for free in sorted({FREE_ITERATIONS, *free_iterations}):
        for inputs in INPUTS:
            history = deflated_rounds(truth, inputs, per_round, patience, generator, free)
            row[f"rounds_{inputs}_free{free}"] = history
            progress(
                f"seed {seed}: deflation by {inputs} inputs, {free} free iterations: "
                f"{history[-1]['found']} of {case.batch_size} columns in {len(history)} rounds"
            )
    return row


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The summary table of the rows so far."""
    lines = [
        "# What limits the sign search (`fl-sim bench reach`)",
        "",
        f"Measured {meta['when']} on {measured_on(meta['hardware'])}, data `{meta['data']}`; "
        f"command: `{meta['command']}`.",
        "",
        "Judge's view, in the attack's coordinates: true columns that are fixed points of the "
        "undeflated sign iteration; share brought back from starts 10 and 20 degrees away; "
        f"then rounds of {meta['per_round']} random starts deflating the columns found so far "
        "(stopping after "
        f"{meta['patience']} rounds that find none), the found samples' input coordinates "
        "estimated as the engine does (max-margin fits to their zero patterns) or exact (the "
        "truth). A point counts as found within 0.999 cosine of a true column.",
        "",
        "| B | m | trained steps | seed | fixed points | basin 10 / 20 deg | free iterations | "
        "estimated inputs: columns found (rounds) | their error, median deg (first / last) | "
        "exact inputs: columns found (rounds) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        basins = " / ".join(f"{v:.0%}" for v in r["basins"].values())
        for free in sorted(int(k.rsplit("free", 1)[1]) for k in r if k.startswith("rounds_exact")):
            est, exact = r[f"rounds_estimated_free{free}"], r[f"rounds_exact_free{free}"]
            errors = [h["input_error_deg"] for h in est if h["input_error_deg"] is not None]
            error = f"{errors[0]:.1f} / {errors[-1]:.1f}" if errors else "-"
            lines.append(
                f"| {r['batch_size']} | {r['width']} | {r['pretrain_steps']} | {r['seed']} | "
                f"{r['fixed_points']} | {basins} | {free} | {est[-1]['found']} ({len(est)}) | "
                f"{error} | {exact[-1]['found']} ({len(exact)}) |"
            )
    return "\n".join(lines) + "\n"


def run_reach(
    cases: list[AttackCase],
    data: ImageSet,
    out: Path,
    *,
    per_round: int,
    patience: int,
    free_iterations: tuple[int, ...] = (),
    command: str = "",
    progress: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Diagnose every seed of every case; rows appended to ``out/rows.jsonl`` as they finish."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "hardware": hardware(),
        "data": data.source,
        "command": command,
        "per_round": per_round,
        "patience": patience,
    }
    # Written first: a run stopped midway keeps its rows' settings and hardware.
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    rows: list[dict[str, Any]] = []
    for case in cases:
        for seed in case.seeds:
            row = diagnose(case, seed, data, per_round, patience, free_iterations, progress)
            rows.append(row)
            with (out / "rows.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            (out / "summary.md").write_text(markdown(rows, meta))
    return rows
