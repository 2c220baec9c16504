"""The forecast in the report: per-round correlations of the proxies with the optimisation
attack's error, a scatter of proxy against MSE per loss, and the clients each proxy ranks most
exposed beside what SPEAR++ recovered from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from fl_sim.forecast.proxies import PROXIES
from fl_sim.forecast.spearman import spearman
from fl_sim.forecast.table import inversion_runs

_SHORT = {
    "grad_norm": "|g|",
    "lavp_l2_max": "L2 max",
    "lavp_l2_min": "L2 min",
    "lavp_cos_min": "cos min",
    "lavp_cos_max": "cos max",
    "lavp_fused": "fused",
}


def _rho(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def correlation_table(rows: list[dict[str, Any]]) -> str:
    """Spearman's rho of each proxy with MSE, per round and attack run (``all``: pooled)."""
    header = f"{'round':>5}  {'attack run':<18} {'n':>4}  " + " ".join(
        f"{_SHORT[p]:>8}" for p in PROXIES
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        label = "all" if row["round"] is None else str(row["round"])
        lines.append(
            f"{label:>5}  {row['run']:<18} {row['samples']:>4}  "
            + " ".join(f"{_rho(row['spearman'][p]):>8}" for p in PROXIES)
        )
    return "\n".join(lines)


def exposure_table(rows: list[dict[str, Any]]) -> str:
    """Per client: its rank by each proxy (1 = most exposed: largest median value) and what
    SPEAR++ recovered (PSNR mean over its records, share of samples exact)."""
    header = (
        f"{'client':>6}  {'defence':<8} {'n':>4}  "
        + " ".join(f"{_SHORT[p]:>8}" for p in PROXIES)
        + f"  {'SPEAR++ PSNR':>12} {'exact':>6}"
    )
    lines = [header, "-" * len(header)]
    for row in sorted(rows, key=lambda r: r["rank"]["lavp_fused"]):
        psnr, exact = row["spearpp_psnr_mean"], row["spearpp_share_exact"]
        lines.append(
            f"{row['client']:>6}  {row['defence']:<8} {row['samples']:>4}  "
            + " ".join(f"{row['rank'][p]:>8}" for p in PROXIES)
            + f"  {'-' if psnr is None else f'{psnr:.1f}':>12} "
            + f"{'-' if exact is None else f'{100 * exact:.0f}%':>6}"
        )
    return "\n".join(lines)


def forecast_scatter(samples: list[dict[str, Any]], path: Path) -> Path | None:
    """One row per optimisation-attack run (loss), one panel per proxy: proxy against the
    reconstruction MSE, log-log, rho in the title. ``None`` when no run scored a sample."""
    runs = inversion_runs(samples)
    if not runs:
        return None
    fig = Figure(figsize=(3.0 * len(PROXIES), 2.8 * len(runs)))
    axes = fig.subplots(len(runs), len(PROXIES), squeeze=False)
    for i, run in enumerate(runs):
        scored = [s for s in samples if f"mse:{run}" in s]
        mse = [max(s[f"mse:{run}"], 1e-15) for s in scored]
        for j, proxy in enumerate(PROXIES):
            ax = axes[i][j]
            values = [s[proxy] for s in scored]
            ax.scatter(values, mse, s=8, alpha=0.7)
            # Proxies spread over a factor of a few: a linear axis in scientific notation.
            ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
            ax.set_yscale("log")
            rho = spearman(values, mse)
            ax.set_title(f"{run}: {_SHORT[proxy]}  rho {_rho(rho)}", fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("reconstruction MSE", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return path
