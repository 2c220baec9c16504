"""Leakage plots from audit records."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from fl_sim.rundir import ACCURACY_PLOT, DATA, ROUNDS, read_json, read_jsonl

# Figures are made without pyplot: no GUI backend, no global state, nothing to close.


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _label(rows: list[dict[str, Any]]) -> str:
    return f"client {rows[0]['client']} ({rows[0]['defence']})"


def leakage_per_round(records: list[dict[str, Any]], path: Path) -> Path:
    """PSNR mean and share of exact samples per round, one line per client."""
    by_client: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_client[r["client"]].append(r)
    fig = Figure(figsize=(10, 3.8))
    (psnr_ax, exact_ax) = fig.subplots(1, 2)
    for client in sorted(by_client):
        rows = sorted(by_client[client], key=lambda r: r["round"])
        rounds = [r["round"] for r in rows]
        psnr_ax.plot(rounds, [r["psnr_mean"] or 0.0 for r in rows], "o-", label=_label(rows))
        exact_ax.plot(rounds, [100 * (r["share_exact"] or 0.0) for r in rows], "o-")
    psnr_ax.axhline(100, color="gray", linestyle=":")
    psnr_ax.set(xlabel="round", ylabel="PSNR mean (dB)", title="reconstruction quality")
    exact_ax.set(
        xlabel="round", ylabel="samples exact (%)", title="share exact (>= 100 dB)", ylim=(-5, 105)
    )
    psnr_ax.legend(fontsize=8)
    return _save(fig, path)


def leakage_per_defence(records: list[dict[str, Any]], path: Path) -> Path:
    """Mean share exact and near-exact per defence, over all its clients and rounds."""
    by_defence: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_defence[r["defence"]].append(r)
    names = sorted(by_defence)
    exact = [
        100 * sum(r["share_exact"] or 0 for r in by_defence[d]) / len(by_defence[d]) for d in names
    ]
    near = [
        100 * sum(r["share_near_exact"] or 0 for r in by_defence[d]) / len(by_defence[d])
        for d in names
    ]
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], exact, width=0.4, label="exact (>= 100 dB)")
    ax.bar([x + 0.2 for x in xs], near, width=0.4, label="near-exact (>= 40 dB)")
    ax.set_xticks(list(xs), names)
    ax.set(ylabel="samples (%)", ylim=(0, 105), title="leakage per defence")
    ax.legend(fontsize=8)
    return _save(fig, path)


def epsilon_vs_leakage(records: list[dict[str, Any]], path: Path) -> Path:
    """PSNR mean against epsilon for DP clients (finite epsilon only)."""
    dp = [r for r in records if r.get("epsilon") is not None and r["epsilon"] != float("inf")]
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    for client in sorted({r["client"] for r in dp}):
        rows = [r for r in dp if r["client"] == client]
        ax.scatter(
            [r["epsilon"] for r in rows],
            [r["psnr_mean"] or 0.0 for r in rows],
            label=f"client {client}",
        )
    ax.set_xscale("log")
    ax.axhline(40, color="gray", linestyle=":")
    ax.set(
        xlabel="epsilon (accumulated, RDP)",
        ylabel="PSNR mean (dB)",
        title="privacy budget against leakage",
    )
    if dp:
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_accuracy(run_dir: Path) -> Path:
    """``accuracy.png``: the global model's test accuracy and loss per round, beside chance
    (one over the classes ``data.json`` names; 10 for runs that predate it)."""
    rows = read_jsonl(run_dir / ROUNDS)
    classes = read_json(run_dir / DATA).get("num_classes", 10)
    rounds = [r["round"] for r in rows]
    fig = Figure(figsize=(6, 3.5))
    acc_ax = fig.subplots()
    acc_ax.plot(rounds, [r["test_accuracy"] for r in rows], "o-", color="tab:blue")
    acc_ax.set_xlabel("round")
    acc_ax.set_ylabel("test accuracy", color="tab:blue")
    acc_ax.axhline(1 / classes, color="gray", linestyle=":", label=f"chance ({classes} classes)")
    loss_ax = acc_ax.twinx()
    loss_ax.plot(rounds, [r["test_loss"] for r in rows], "s--", color="tab:red")
    loss_ax.set_ylabel("test loss", color="tab:red")
    acc_ax.legend(loc="lower right")
    fig.suptitle("global model on the held-out split")
    return _save(fig, run_dir / ACCURACY_PLOT)
