"""``fl-sim report RUN_DIR``: summary table, plots and a self-contained HTML report."""

from __future__ import annotations

import base64
import functools
from collections import defaultdict
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, Template

from fl_sim.forecast.table import (
    client_exposure,
    is_spearpp,
    joined_samples,
    record_run,
    round_correlations,
)
from fl_sim.report.coverage import client_coverage, coverage_note, coverage_table
from fl_sim.report.faults import left_out_table
from fl_sim.report.forecast import correlation_table, exposure_table, forecast_scatter
from fl_sim.report.plots import epsilon_vs_leakage, leakage_per_defence, leakage_per_round
from fl_sim.rundir import (
    ACCURACY_PLOT,
    AUDIT,
    CLIENTS,
    COHORT_VIEW,
    DATA,
    PLOTS_DIR,
    PROXIES,
    REPORT,
    ROUNDS,
    SCENARIO,
    read_json,
    read_jsonl,
)

# Shipped beside this module (pyproject's package-data), autoescaped: every value the template
# gets is text from the run's records, escaped once, there.
REPORT_TEMPLATE = "report.html.j2"


@functools.cache
def _template() -> Template:
    """The report's template, loaded at the first report: a FAB of fl-sim's own sources
    (``flwr run .``) carries only Flower's file types (.py, .toml, .md, ...), so the ServerApp
    it runs imports this module without the template beside it."""
    environment = Environment(
        loader=PackageLoader("fl_sim.report", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return environment.get_template(REPORT_TEMPLATE)


def _fmt(value: Any, pattern: str = "{:.1f}") -> str:
    return "-" if value is None else pattern.format(value)


def summary_table(records: list[dict[str, Any]]) -> str:
    """Per client, SPEAR++ records only: defence, last epsilon, rounds attacked, statuses, PSNR,
    the exact and near-exact shares (the judge's) and the certified share (what the attack
    vouches for without ground truth)."""
    by_client: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if is_spearpp(r) and not is_cohort(r):
            by_client[r["client"]].append(r)
    # As wide as the longest defence label (a client's update mods join it: fedsgd+topk).
    wide = max([8, *(len(r["defence"]) for rows in by_client.values() for r in rows)])
    # Clients of a Flower app of one's own are its 64-bit node ids.
    cw = max([6, *(len(str(c)) for c in by_client)])
    header = (
        f"{'client':>{cw}}  {'defence':<{wide}} {'epsilon':>10} {'rounds':>6}  {'statuses':<22} "
        f"{'PSNR mean':>9} {'PSNR min':>8} {'exact':>6} {'near':>6} {'cert.':>6}"
    )
    lines = [header, "-" * len(header)]
    for client in sorted(by_client):
        rows = sorted(by_client[client], key=lambda r: r["round"])
        scored = [r for r in rows if r.get("psnr_mean") is not None]
        statuses: dict[str, int] = defaultdict(int)
        for r in rows:
            statuses[r["status"]] += 1
        eps = rows[-1].get("epsilon")
        mean = sum(r["psnr_mean"] for r in scored) / len(scored) if scored else None
        low = min((r["psnr_min"] for r in scored), default=None)
        exact = sum(r["share_exact"] for r in scored) / len(scored) if scored else None
        near = sum(r["share_near_exact"] for r in scored) / len(scored) if scored else None
        # Without ground truth too: the attack's own certificate needs no judge.
        vouched = [r["share_certified"] for r in rows if r.get("share_certified") is not None]
        cert = sum(vouched) / len(vouched) if vouched else None
        lines.append(
            f"{client:>{cw}}  {rows[0]['defence']:<{wide}} {_fmt(eps, '{:.3g}'):>10} "
            f"{len(rows):>6}  "
            f"{', '.join(f'{k} {v}' for k, v in sorted(statuses.items())):<22} "
            f"{_fmt(mean):>9} {_fmt(low):>8} {_fmt(exact and 100 * exact, '{:.0f}%'):>6} "
            f"{_fmt(near and 100 * near, '{:.0f}%'):>6} "
            f"{_fmt(cert if cert is None else 100 * cert, '{:.0f}%'):>6}"
        )
    return "\n".join(lines)


def is_cohort(record: dict[str, Any]) -> bool:
    """Whether a record is the attack on a secure aggregate as a whole (not one client's)."""
    return record.get("view") == COHORT_VIEW


def cohort_table(records: list[dict[str, Any]]) -> str:
    """Per round under secure aggregation: the summed clients, the samples in the sum, what the
    attack on it found and the judge's shares over all of them, then over every round ('' when
    the run had no secure aggregate)."""
    rows = sorted((r for r in records if is_cohort(r)), key=lambda r: r["round"])
    if not rows:
        return ""
    header = (
        f"{'round':>5}  {'clients':>7} {'samples':>7}  {'status':<10} {'columns':>7} "
        f"{'PSNR mean':>9} {'exact':>6} {'near':>6}  dropped"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['round']:>5}  {len(r.get('clients', [])):>7} {r.get('batch_size') or 0:>7}  "
            f"{r['status']:<10} {_fmt(r.get('columns_verified'), '{}'):>7} "
            f"{_fmt(r.get('psnr_mean')):>9} "
            f"{_fmt(r.get('share_exact') and 100 * r['share_exact'], '{:.0f}%'):>6} "
            f"{_fmt(r.get('share_near_exact') and 100 * r['share_near_exact'], '{:.0f}%'):>6}  "
            f"{len(r.get('dropped_nodes', []))}"
        )
    scored = [r for r in rows if r.get("share_exact") is not None]
    if scored:
        samples = sum(r["batch_size"] for r in scored)
        exact = sum(r["share_exact"] * r["batch_size"] for r in scored) / max(samples, 1)
        near = sum(r["share_near_exact"] * r["batch_size"] for r in scored) / max(samples, 1)
        lines.append(
            f"over {len(scored)} rounds, {samples} samples: {100 * exact:.0f}% exact, "
            f"{100 * near:.0f}% near-exact"
        )
    return "\n".join(lines)


def server_behaviour(rounds: list[dict[str, Any]], clients: list[dict[str, Any]]) -> dict[str, Any]:
    """What the server sent (``behaviour``: honest before there were others) and how many of
    the clients' checks of the model they received (``checked``) ``flagged`` it."""
    checked = [c for c in clients if "tamper_flagged" in c]
    return {
        "behaviour": rounds[-1].get("server_behaviour", "honest") if rounds else "honest",
        "flagged": sum(bool(c["tamper_flagged"]) for c in checked),
        "checked": len(checked),
    }


def inversion_table(records: list[dict[str, Any]]) -> str:
    """Per client and optimisation-attack run: records, PSNR mean, median MSE over samples and
    the share of batches whose labels were recovered right ('' when no such record)."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if not is_spearpp(r) and r.get("psnr_mean") is not None:
            groups[(r["client"], record_run(r))].append(r)
    if not groups:
        return ""
    wide = max([8, *(len(r["defence"]) for rows in groups.values() for r in rows)])
    header = (
        f"{'client':>6}  {'defence':<{wide}} {'attack run':<18} {'rounds':>6} {'PSNR mean':>9} "
        f"{'MSE median':>10} {'labels':>6}"
    )
    lines = [header, "-" * len(header)]
    for (client, run), rows in sorted(groups.items()):
        mse = sorted(s["mse"] for r in rows for s in r.get("samples", []))
        right = [
            sorted(r["labels_recovered"]) == sorted(s["label"] for s in r["samples"])
            for r in rows
            if "labels_recovered" in r and "samples" in r
        ]
        lines.append(
            f"{client:>6}  {rows[0]['defence']:<{wide}} {run:<18} {len(rows):>6} "
            f"{sum(r['psnr_mean'] for r in rows) / len(rows):>9.1f} "
            f"{_fmt(mse[len(mse) // 2] if mse else None, '{:.2e}'):>10} "
            f"{_fmt(sum(right) / len(right) * 100 if right else None, '{:.0f}%'):>6}"
        )
    return "\n".join(lines)


def forecast_tables(run_dir: Path) -> tuple[str, str, list[dict[str, Any]]]:
    """The proxies' correlation table and client exposure table of a run ('' where there is
    nothing to show), and the joined per-sample rows."""
    records = read_jsonl(run_dir / AUDIT)
    samples = joined_samples(records, read_jsonl(run_dir / PROXIES))
    if not samples:
        return "", "", samples
    rows = round_correlations(samples)
    return (
        correlation_table(rows) if rows else "",
        exposure_table(client_exposure(samples, records)),
        samples,
    )


def planned_rounds(run_dir: Path) -> int | None:
    """The rounds the run's scenario asked for (``scenario.json``), if it says."""
    rounds = read_json(run_dir / SCENARIO).get("typed", {}).get("rounds")
    return int(rounds) if rounds is not None else None


def _shape(data: dict[str, Any]) -> str:
    """' (30 features, 2 classes)' or ' (3 x 32 x 32 images, 10 classes)', from ``data.json``
    ('' for runs that predate the shape there)."""
    shape, classes = data.get("input_shape"), data.get("num_classes")
    if shape is None or classes is None:
        return ""
    what = f"{shape[0]} features" if len(shape) == 1 else " x ".join(map(str, shape)) + " images"
    return f" ({what}, {classes} classes)"


def _png(path: Path) -> str:
    """A PNG file as a ``data:`` URI: the report opens offline, as one file."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _row(run_dir: Path, r: dict[str, Any]) -> dict[str, Any]:
    """One record's row of the report's table of every reconstruction."""
    grid = run_dir / r["grid"] if r.get("grid") else None
    return {
        "round": r["round"],
        "client": "sum" if is_cohort(r) else r["client"],
        "attack": "-" if "attack" in r and r["attack"] is None else record_run(r),
        "defence": r["defence"],
        "epsilon": _fmt(r.get("epsilon"), "{:.3g}"),
        "status": r["status"],
        "batch": f"{r.get('batch_size')} / {_fmt(r.get('batch_size_estimated'), '{}')}",
        "psnr": _fmt(r.get("psnr_mean")),
        "exact": _fmt(r.get("share_exact") and 100 * r["share_exact"], "{:.0f}%"),
        "columns": f"{_fmt(r.get('columns_verified'), '{}')} / {_fmt(r.get('certified'), '{}')}",
        "grid": _png(grid) if grid and grid.is_file() else None,
        "reason": str(r.get("reason") or ""),
    }


def build_report(run_dir: Path) -> Path:
    """Write the plots and ``report.html`` (all images inline, opens offline) for a run."""
    records = read_jsonl(run_dir / AUDIT)
    rounds = read_jsonl(run_dir / ROUNDS)
    clients = read_jsonl(run_dir / CLIENTS)
    done = max((r["round"] for r in rounds), default=0)
    planned = planned_rounds(run_dir)
    data = read_json(run_dir / DATA)
    plots_dir = run_dir / PLOTS_DIR
    plots_dir.mkdir(exist_ok=True)
    scored = [
        r for r in records if r.get("psnr_mean") is not None and is_spearpp(r) and not is_cohort(r)
    ]
    figures = []
    if scored:
        figures = [
            (
                "Leakage per round and client",
                leakage_per_round(scored, plots_dir / "leakage_rounds.png"),
            ),
            ("Leakage per defence", leakage_per_defence(scored, plots_dir / "leakage_defence.png")),
            ("Epsilon against leakage", epsilon_vs_leakage(scored, plots_dir / "epsilon.png")),
        ]
    if (run_dir / ACCURACY_PLOT).is_file():
        figures.append(("Global model", run_dir / ACCURACY_PLOT))
    correlations, exposure, samples = forecast_tables(run_dir)
    scatter = forecast_scatter(samples, plots_dir / "forecast.png")
    epsilons = [r for r in rounds if r.get("epsilon") is not None]
    page = _template().render(
        run_name=run_dir.name,
        data_source=str(data.get("source", "unknown")),
        shape=_shape(data),
        done=done,
        planned=planned,
        stopped_early=planned is not None and done < planned,
        server=server_behaviour(rounds, clients),
        accuracy=_fmt(rounds[-1]["test_accuracy"] if rounds else None, "{:.3f}"),
        summary=summary_table(records),
        missing=coverage_note(run_dir),
        coverage=coverage_table(client_coverage(run_dir)),
        cohorts=cohort_table(records),
        epsilons="\n".join(f"round {r['round']:>3}: epsilon {r['epsilon']:.3g}" for r in epsilons),
        faults=left_out_table(clients),
        figures=[{"title": title, "src": _png(path)} for title, path in figures],
        inversion=inversion_table(records),
        correlations=correlations,
        exposure=exposure,
        scatter=_png(scatter) if scatter is not None else None,
        rows=[
            _row(run_dir, r)
            for r in sorted(records, key=lambda r: (r["round"], r["client"], record_run(r)))
        ],
    )
    out = run_dir / REPORT
    out.write_text(page)
    return out
