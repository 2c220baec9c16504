"""Audit records and proxy rows joined per sample; per-round correlations; client exposure.

Input: the records of ``audit.jsonl`` (per-sample ``samples`` with ``mse`` and ``psnr``) and the
rows of ``proxies.jsonl`` (per-sample proxies). Every function here reads plain dicts, so the
report and the auditor share them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from fl_sim.forecast.proxies import PROXIES
from fl_sim.forecast.spearman import spearman


def record_run(record: dict[str, Any]) -> str:
    """A record's attack run: ``spearpp`` (also for records from before there were others),
    or ``inversion-LOSS``."""
    attack = record.get("attack") or "spearpp"
    return f"{attack}-{record['loss']}" if record.get("loss") else str(attack)


def is_spearpp(record: dict[str, Any]) -> bool:
    """SPEAR++ records, and records of replies no attack could use (``attack`` None)."""
    return record.get("attack") in (None, "spearpp")


def joined_samples(
    records: Iterable[dict[str, Any]], proxy_rows: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per (round, client, sample) with proxies: its proxies and, per attack run that
    scored it, ``mse:RUN`` and ``psnr:RUN``."""
    rows: dict[tuple[int, int, int], dict[str, Any]] = {}
    for row in proxy_rows:
        for s in row.get("samples") or []:
            key = (row["round"], row["client"], s["id"])
            rows[key] = {
                "round": row["round"],
                "client": row["client"],
                "defence": row.get("defence", "unknown"),
                "id": s["id"],
                "label": s["label"],
                **{name: s[name] for name in PROXIES},
            }
    for record in records:
        run = record_run(record)
        for s in record.get("samples") or []:
            joined = rows.get((record["round"], record["client"], s["id"]))
            if joined is not None:
                joined[f"mse:{run}"] = s["mse"]
                joined[f"psnr:{run}"] = s["psnr"]
    return sorted(rows.values(), key=lambda r: (r["round"], r["client"], r["id"]))


def inversion_runs(samples: Iterable[dict[str, Any]]) -> list[str]:
    """The optimisation attack's runs that scored any of ``samples``."""
    runs = {k.partition(":")[2] for s in samples for k in s if k.startswith("mse:")}
    return sorted(r for r in runs if r != "spearpp")


def correlations(samples: list[dict[str, Any]], run: str) -> dict[str, Any]:
    """Spearman's rho of each proxy with the MSE of ``run`` over the samples it scored."""
    scored = [s for s in samples if f"mse:{run}" in s]
    mse = [s[f"mse:{run}"] for s in scored]
    return {
        "run": run,
        "samples": len(scored),
        "spearman": {p: spearman([s[p] for s in scored], mse) for p in PROXIES},
    }


def round_correlations(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round and optimisation-attack run, then over all rounds (``round`` None)."""
    out = []
    rounds = sorted({s["round"] for s in samples})
    for run in inversion_runs(samples):
        for r in rounds:
            row = correlations([s for s in samples if s["round"] == r], run)
            if row["samples"]:
                out.append({"round": r, **row})
        out.append({"round": None, **correlations(samples, run)})
    return out


def client_exposure(
    samples: list[dict[str, Any]], records: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per client: the median of each proxy over its samples and rounds, its rank by each proxy
    (1 = largest value = most exposed, as the paper reads LAVP), and what SPEAR++ recovered."""
    by_client: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        by_client[s["client"]].append(s)
    spear: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if is_spearpp(r) and r.get("psnr_mean") is not None:
            spear[r["client"]].append(r)
    rows = []
    for client, rows_of in sorted(by_client.items()):
        scored = spear.get(client, [])
        rows.append(
            {
                "client": client,
                "defence": rows_of[0]["defence"],
                "samples": len(rows_of),
                "proxies": {p: float(np.median([s[p] for s in rows_of])) for p in PROXIES},
                "spearpp_psnr_mean": (
                    float(np.mean([r["psnr_mean"] for r in scored])) if scored else None
                ),
                "spearpp_share_exact": (
                    float(np.mean([r["share_exact"] for r in scored])) if scored else None
                ),
            }
        )
    for p in PROXIES:
        order = sorted(rows, key=lambda row: -row["proxies"][p])
        for rank, row in enumerate(order, start=1):
            row.setdefault("rank", {})[p] = rank
    return rows
