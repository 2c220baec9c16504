"""``fl-sim bench sweep``: the largest batch size attacked exactly, per width of the first layer.

For each width m, B grows from a start by a step until the share of exact samples over the
seeds falls below the threshold (a B stops at the first seeds that settle it); the largest B
that met it is the width's limit. Rows are appended to ``rows.jsonl`` as they finish,
``sweep.json`` and ``summary.md`` are rewritten after each B, and ``limit.png`` plots the limits
against m beside the paper's rows. A sweep runs at initialisation or, with a
:class:`Pretraining`, on networks trained first.
:func:`combine_sweeps` joins sweeps run apart (one width per process, at initialisation and
trained) into one table and plot, one line per network.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure

from attacks import SpearConfig
from fl_sim.bench.attack import run_case
from fl_sim.bench.attack_table import aggregate
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.converge import Convergence
from fl_sim.bench.machine import hardware, measured_on
from fl_sim.bench.pretrain import Pretraining
from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization

log = logging.getLogger(__name__)

AT_INIT = "at initialisation"

# The SPEAR++ paper's depth-6 rows (B, m, share exact with its best optimiser), for the plot.
PAPER_POINTS: tuple[tuple[int, int, float], ...] = (
    (20, 200, 0.95),
    (65, 1000, 1.00),
    (100, 4000, 1.00),
    (150, 4000, 1.00),
    (210, 4000, 0.77),
)


@dataclass(frozen=True)
class SweepPlan:
    """Batch sizes to try at one width: ``start``, ``start + step``, ... up to ``stop``."""

    width: int
    start: int
    step: int
    stop: int

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.stop or self.step < 1:
            raise ValueError(
                f"sweep at m={self.width}: need 1 <= start ({self.start}) <= stop ({self.stop}) "
                f"and step ({self.step}) >= 1"
            )


def network_label(
    pretrain: Pretraining,
    converged: Convergence | None = None,
    centred: bool = True,
    own_images: bool = False,
) -> str:
    """How a sweep's networks were trained and fed, as its series is named."""
    inputs = "" if centred else ", [0, 1] inputs"
    if converged is not None:
        batches = ", its own training images" if own_images else ""
        return f"converged ({converged.epochs} epochs on the training split){inputs}{batches}"
    if not pretrain.steps:
        return AT_INIT + inputs
    return f"trained {pretrain.steps} SGD steps (lr {pretrain.lr:g}){inputs}"


def _plot(series: dict[str, dict[int, int | None]], path: Path) -> None:
    """Left: the limit B against m beside the paper's rows, one line per network (at
    initialisation, trained, converged, memorised, un-centred); right: B/m against m, where the
    paper observes a slowly falling ratio. Each network's limits are written in its legend
    entry: at m=200 five of them share a handful of pixels."""
    fig = Figure(figsize=(11, 6))
    ax, ratio = fig.subplots(1, 2, gridspec_kw={"wspace": 0.3})
    widths: list[int] = []
    for k, (network, limits) in enumerate(series.items()):
        widths += list(limits)
        measured = sorted((m, b) for m, b in limits.items() if b)
        none = sorted(m for m, b in limits.items() if not b)
        figures = [f"m={m}: {b}" for m, b in measured] + [f"m={m}: none" for m in none]
        label = f"{network} ({', '.join(figures)})"
        if not measured:
            ax.plot([], [], " ", label=label)
            continue
        init = network == AT_INIT
        style = "o-" if init else ("s--", "^:", "d-.", "v--", "P:")[k % 5]
        # Other networks' markers are hollow and larger: they often sit on the init ones.
        look = {} if init else {"mfc": "none", "ms": 10}
        ax.plot(*zip(*measured, strict=True), style, label=label, **look)
        ratio.plot([m for m, _ in measured], [b / m for m, b in measured], style, **look)
        if init:
            for m, b in measured:
                ax.annotate(
                    f"B={b}", (m, b), textcoords="offset points", xytext=(4, -12), fontsize="small"
                )
    for b, m, share in PAPER_POINTS:
        ax.plot(m, b, "x", color="grey")
        ax.annotate(
            f"paper {share:.0%}", (m, b), textcoords="offset points", xytext=(-6, 4), ha="right"
        )
        ratio.plot(m, b / m, "x", color="grey")
    ax.plot([], [], "x", color="grey", label="the paper's rows (B, any share exact)")
    ax.set_xlabel("width m of the first layer")
    ax.set_ylabel("batch size B")
    ax.margins(y=0.15)
    ax.set_title("Batch-size limit of exact reconstruction (>= 90% exact, depth 6)")
    ratio.set_xlabel("width m of the first layer")
    ratio.set_ylabel("B / m")
    ratio.set_title("The limit as a share of the width")
    ratio.set_ylim(bottom=0)
    for axis in (ax, ratio):
        axis.set_xlim(0, 1.1 * max([m for _, m, _ in PAPER_POINTS] + widths))
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", fontsize="small", frameon=False)
    fig.subplots_adjust(bottom=0.1 + 0.035 * (len(series) + 1))
    fig.savefig(path, dpi=120, bbox_inches="tight")


def run_sweep(
    plans: list[SweepPlan],
    data: ImageSet,
    out: Path,
    *,
    seeds: tuple[int, ...],
    attack: SpearConfig,
    threshold: float = 0.9,
    command: str = "",
    pretrain: Pretraining | None = None,
    converged: Convergence | None = None,
    train: ImageSet | None = None,
    centred: bool = True,
    own_images: bool = False,
) -> dict[int, int | None]:
    """Run the sweep of every plan; the largest B meeting ``threshold`` per width (``None``
    when even the start missed it). With ``pretrain`` every network is trained first (each
    seed its own, the attacked batch kept out); with ``converged``, on all of ``train`` (and
    with ``own_images`` attacked on batches of it); with ``centred`` false, on [0, 1] pixels."""
    out.mkdir(parents=True, exist_ok=True)
    norm = Normalization()
    pretrain = pretrain or Pretraining()
    network = network_label(pretrain, converged, centred, own_images)
    meta = {
        "hardware": hardware(),
        "data": data.source,
        "command": command,
        "seeds": seeds,
        "network": network,
    }
    limits: dict[int, int | None] = {}
    steps: list[dict[str, Any]] = []
    for plan in plans:
        limits[plan.width] = None
        for b in range(plan.start, plan.stop + 1, plan.step):
            case = AttackCase(
                f"sweep B={b} m={plan.width}, {network}",
                b,
                plan.width,
                attack=attack,
                pretrain=pretrain,
                converged=converged,
                own_images=own_images,
                centred=centred,
            )
            rows = []
            for k, seed in enumerate(seeds):
                row = run_case(case, seed, data, norm, torch.float64, train=train)
                rows.append(row)
                with (out / "rows.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
                # Stop this B once even all-exact remaining seeds could not lift it to the
                # threshold: a failing B costs a seed, not every seed's time budget.
                exact = sum(r["share_exact"] * r["samples"] for r in rows)
                if (exact + b * (len(seeds) - k - 1)) / (b * len(seeds)) < threshold:
                    break
            summary = {
                "network": network,
                "width": plan.width,
                "batch_size": b,
                **aggregate(rows),
                # What kept each seed short of every sample exact, in the attack's own words.
                "misses": [
                    f"seed {r['seed']}: {r['attack']['status']}, {r['attack']['reason']}"
                    for r in rows
                    if r["share_exact"] < 1
                ],
            }
            steps.append(summary)
            passed = summary["share_exact_samples"] >= threshold
            log.info(
                "m=%d B=%d: %.0f%% exact, %.1f s mean",
                plan.width,
                b,
                100 * summary["share_exact_samples"],
                summary["seconds_mean"],
            )
            if passed:
                limits[plan.width] = b
            meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
            (out / "sweep.json").write_text(
                json.dumps({"meta": meta, "limits": limits, "steps": steps}, indent=2)
            )
            (out / "summary.md").write_text(_markdown({network: limits}, steps, [meta], threshold))
            _plot({network: limits}, out / "limit.png")
            if not passed:
                break
    return limits


def combine_sweeps(
    folders: list[Path], out: Path, threshold: float = 0.9
) -> dict[str, dict[int, int | None]]:
    """One table (``summary.md``), ``sweep.json`` and ``limit.png`` from the ``sweep.json`` of
    sweeps run apart; each keeps its own hardware line and command. The limits per network
    (sweeps from before networks were trained count as at initialisation), then per width.

    Raises
    ------
    ValueError
        When two folders swept the same width on the same kind of network.
    """
    series: dict[str, dict[int, int | None]] = {}
    steps: list[dict[str, Any]] = []
    metas: list[dict[str, Any]] = []
    for folder in folders:
        part = json.loads((folder / "sweep.json").read_text())
        network = part["meta"].get("network", AT_INIT)
        limits = series.setdefault(network, {})
        for width, b in part["limits"].items():
            if int(width) in limits:
                raise ValueError(f"m={width} ({network}) was swept in more than one of {folders}")
            limits[int(width)] = b
        steps += [{"network": network, **s} for s in part["steps"]]
        metas.append(part["meta"])
    series = {k: dict(sorted(v.items())) for k, v in sorted(series.items(), key=_init_first)}
    steps.sort(key=lambda s: (s["network"] != AT_INIT, s["network"], s["width"], s["batch_size"]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(
        json.dumps({"metas": metas, "limits": series, "steps": steps}, indent=2)
    )
    (out / "summary.md").write_text(_markdown(series, steps, metas, threshold))
    _plot(series, out / "limit.png")
    return series


def _init_first(item: tuple[str, Any]) -> tuple[bool, str]:
    return item[0] != AT_INIT, item[0]


def _measured(meta: dict[str, Any]) -> str:
    return (
        f"Measured {meta['finished']} on {measured_on(meta['hardware'])}, data "
        f"`{meta['data']}`, networks {meta.get('network', AT_INIT)}, seeds "
        f"{list(meta['seeds'])}; command: `{meta['command']}`"
    )


def _markdown(
    series: dict[str, dict[int, int | None]],
    steps: list[dict[str, Any]],
    metas: list[dict[str, Any]],
    threshold: float,
) -> str:
    lines = [
        *(f"{_measured(meta)}.\n" for meta in metas),
        *(
            f"Largest B with >= {threshold:.0%} of samples exact (PSNR >= 100 dB), {network}: "
            + ", ".join(f"m={m}: {b if b else 'none'}" for m, b in limits.items())
            for network, limits in series.items()
        ),
        "",
        "| network | m | B | seeds run | exact | s mean "
        "| factorise / search / refine / select+solve s |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        st = s["stage_seconds_mean"]
        lines.append(
            f"| {s.get('network', AT_INIT)} | {s['width']} | {s['batch_size']} | "
            f"{','.join(map(str, s['seeds']))} | "
            f"{100 * s['share_exact_samples']:.1f}% | "
            f"{s['seconds_mean']:.1f} | "
            + " / ".join(f"{st.get(k, 0.0):.1f}" for k in ("factorise", "search", "refine"))
            + f" / {st.get('select', 0.0) + st.get('solve', 0.0):.2f} |"
        )
    missed = [s for s in steps if s["share_exact_samples"] < threshold and s.get("misses")]
    if missed:
        lines += [
            "",
            "What bounds each limit: the batch size that missed, per seed short of exact:",
        ]
    for s in missed:
        lines += [
            "",
            f"- {s.get('network', AT_INIT)}, m={s['width']}, B={s['batch_size']}:",
            *(f"  - {miss}" for miss in s["misses"]),
        ]
    return "\n".join(lines) + "\n"
