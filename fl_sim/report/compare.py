"""What a dishonest server gets against the honest one: runs of one scenario and seed, one per
server behaviour, side by side (``fl-sim compare HONEST_DIR OTHER_DIR...``).

Per run: the share of the clients' samples recovered exactly and near-exactly (of every
per-client record, by the best of the attacks run on that update; under SecAgg+ the judge's
per-client records drawn from the attack on the sum), the share of the most exposed client's
samples, the global model's final test accuracy (``rounds.jsonl``) and its cost against the
honest run's, and the share of the clients' replies whose own check of the model they received
fired (``clients.jsonl``), with the checks that did. The runs must be of one scenario apart from
``[server]``: the first difference is named otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fl_sim.rundir import AUDIT, CLIENTS, COHORT_VIEW, ROUNDS, SCENARIO, read_json, read_jsonl

COMPARE_JSON = "compare.json"
COMPARE_TABLE = "compare.txt"
COMPARE_PLOT = "compare.png"
# The scenario's table that may differ between the compared runs.
SERVER = "server"


@dataclass(frozen=True)
class BehaviourRun:
    """One run's figures.

    Attributes
    ----------
    run_dir
        Where they come from.
    behaviour
        The server behaviour that ran.
    samples
        Samples in the per-client records (each client's batch, every round).
    share_exact, share_near_exact
        Of them, recovered exactly (PSNR >= 100 dB) and near-exactly (>= 40 dB), each record
        counted by its best attack.
    most_exposed_client, most_exposed_share
        The client with the largest exact share over the run, and that share.
    most_exposed_by_round
        Per round, the largest exact share of one client's batch (a behaviour that isolates
        one client in some rounds shows there).
    by_attack
        Per attack: the exact share of the samples it was run on.
    final_accuracy
        The global model's test accuracy after the last round.
    accuracy_cost
        The honest run's final accuracy minus this one's (0 for the honest run).
    replies_checked, replies_flagged
        The clients' replies that carried their check of the model they received, and of them
        those the check flagged.
    checks_fired
        How many replies each check fired in.
    """

    run_dir: str
    behaviour: str
    samples: int
    share_exact: float
    share_near_exact: float
    most_exposed_client: int | None
    most_exposed_share: float
    most_exposed_by_round: dict[int, float]
    by_attack: dict[str, float]
    final_accuracy: float | None
    accuracy_cost: float | None
    replies_checked: int
    replies_flagged: int
    checks_fired: dict[str, int]

    @property
    def flagged_share(self) -> float:
        """The share of checked replies flagged."""
        return self.replies_flagged / self.replies_checked if self.replies_checked else 0.0


def scenario_of(run_dir: Path) -> dict[str, Any]:
    """The validated scenario a run directory recorded (``scenario.json``'s ``typed``)."""
    path = run_dir / SCENARIO
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a run directory (no {SCENARIO})")
    typed: dict[str, Any] = read_json(path)["typed"]
    return typed


def first_difference(a: Any, b: Any, key: str = "") -> str | None:
    """The dotted key of the first place ``a`` and ``b`` differ with both values, or
    ``None`` when they are equal."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted(set(a) | set(b)):
            where = f"{key}.{k}" if key else str(k)
            if k not in a or k not in b:
                return f"{where}: {a.get(k, '(absent)')!r} against {b.get(k, '(absent)')!r}"
            found = first_difference(a[k], b[k], where)
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{key}.{i}")
            if found is not None:
                return found
        return None
    return None if a == b else f"{key}: {a!r} against {b!r}"


def summarise(run_dir: Path, honest_accuracy: float | None = None) -> BehaviourRun:
    """One run's figures (``honest_accuracy``: the honest run's final accuracy, for the
    cost)."""
    behaviour = scenario_of(run_dir)[SERVER]["behaviour"]["behaviour"]
    best: dict[tuple[int, int], dict[str, Any]] = {}
    attacked: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for record in read_jsonl(run_dir / AUDIT):
        size = record.get("batch_size")
        if record.get("view") == COHORT_VIEW or not size or "attack" not in record:
            continue
        exact = record.get("share_exact") or 0.0
        near = record.get("share_near_exact") or 0.0
        counts = attacked[record["attack"]]
        counts[0] += round(exact * size)
        counts[1] += size
        key = (record["round"], record["client"])
        if key not in best or (exact, near) > (best[key]["exact"], best[key]["near"]):
            best[key] = {"exact": exact, "near": near, "size": size}
    samples = sum(b["size"] for b in best.values())
    per_client: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (_, client), b in best.items():
        per_client[client][0] += b["exact"] * b["size"]
        per_client[client][1] += b["size"]
    exposed = max(per_client, key=lambda c: per_client[c][0] / per_client[c][1], default=None)
    by_round: dict[int, float] = {}
    for (server_round, _), b in sorted(best.items()):
        by_round[server_round] = max(by_round.get(server_round, 0.0), b["exact"])
    rounds = read_jsonl(run_dir / ROUNDS)
    accuracy = float(rounds[-1]["test_accuracy"]) if rounds else None
    checked = [c for c in read_jsonl(run_dir / CLIENTS) if "tamper_flagged" in c]
    flagged = [c for c in checked if c["tamper_flagged"]]
    fired: Counter[str] = Counter()
    for c in flagged:  # runs from before the checks were named carry no names
        fired.update(n for n in str(c.get("tamper_checks", "")).split(", ") if n)
    return BehaviourRun(
        run_dir=str(run_dir),
        behaviour=behaviour,
        samples=samples,
        share_exact=sum(b["exact"] * b["size"] for b in best.values()) / max(samples, 1),
        share_near_exact=sum(b["near"] * b["size"] for b in best.values()) / max(samples, 1),
        most_exposed_client=exposed,
        most_exposed_share=(
            per_client[exposed][0] / per_client[exposed][1] if exposed is not None else 0.0
        ),
        most_exposed_by_round=by_round,
        by_attack={a: n / total for a, (n, total) in sorted(attacked.items())},
        final_accuracy=accuracy,
        accuracy_cost=(
            honest_accuracy - accuracy
            if honest_accuracy is not None and accuracy is not None
            else None
        ),
        replies_checked=len(checked),
        replies_flagged=len(flagged),
        checks_fired=dict(sorted(fired.items())),
    )


def compare_runs(honest_dir: Path, others: Sequence[Path]) -> list[BehaviourRun]:
    """The honest run's figures, then each other run's, with its cost against the honest one.

    Raises
    ------
    ValueError
        When the first run's server is not honest, or another run's scenario differs from it
        outside ``[server]`` (naming the first difference).
    """
    reference = scenario_of(honest_dir)
    name = reference[SERVER]["behaviour"]["behaviour"]
    if name != "honest":
        raise ValueError(f"{honest_dir}: server.behaviour = {name!r}, expected 'honest' first")
    plain = {k: v for k, v in reference.items() if k != SERVER}
    for other in others:
        theirs = {k: v for k, v in scenario_of(other).items() if k != SERVER}
        difference = first_difference(plain, theirs)
        if difference is not None:
            raise ValueError(
                f"{other} is not the scenario of {honest_dir} apart from [server]: {difference}"
            )
    honest = summarise(honest_dir)
    accuracy = honest.final_accuracy
    honest = dataclasses.replace(honest, accuracy_cost=None if accuracy is None else 0.0)
    return [honest, *(summarise(o, accuracy) for o in others)]


def table(runs: Sequence[BehaviourRun]) -> str:
    """The comparison as a text table, one row per run."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    def acc(x: float | None) -> str:
        return "-" if x is None else f"{x:+.3f}" if x else "0"

    head = (
        f"{'behaviour':<10} {'samples':>7} {'exact':>6} {'near':>6} {'most exposed':>14} "
        f"{'accuracy':>8} {'cost':>7} {'check fired':>12}  checks"
    )
    lines = [head, "-" * len(head)]
    for r in runs:
        exposed = f"{pct(r.most_exposed_share)} (c{r.most_exposed_client})"
        final = "-" if r.final_accuracy is None else f"{r.final_accuracy:.3f}"
        fired = f"{r.replies_flagged}/{r.replies_checked}"
        checks = ", ".join(f"{k} {v}" for k, v in r.checks_fired.items()) or "-"
        lines.append(
            f"{r.behaviour:<10} {r.samples:>7} {pct(r.share_exact):>6} "
            f"{pct(r.share_near_exact):>6} {exposed:>14} {final:>8} "
            f"{acc(r.accuracy_cost):>7} {fired:>12}  {checks}"
        )
    return "\n".join(lines)


def plot(runs: Sequence[BehaviourRun], path: Path) -> Path:
    """Bars per run: exact and near-exact shares, the most exposed client's, and the share of
    replies flagged."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 3.5))
    ax = figure.add_subplot()
    series = {
        "exact": [r.share_exact for r in runs],
        "near-exact": [r.share_near_exact for r in runs],
        "most exposed client, exact": [r.most_exposed_share for r in runs],
        "replies flagged": [r.flagged_share for r in runs],
    }
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(runs))], values, width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(runs))])
    ax.set_xticklabels([r.behaviour for r in runs])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share")
    ax.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def write_comparison(runs: Sequence[BehaviourRun], out: Path) -> list[Path]:
    """``compare.json``, ``compare.txt`` and ``compare.png`` in ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(r) | {"flagged_share": r.flagged_share} for r in runs]
    written = [out / COMPARE_JSON, out / COMPARE_TABLE]
    written[0].write_text(json.dumps(rows, indent=2) + "\n")
    written[1].write_text(table(runs) + "\n")
    written.append(plot(runs, out / COMPARE_PLOT))
    return written


def _command(args: argparse.Namespace) -> int:
    honest = Path(args.honest_dir)
    try:
        runs = compare_runs(honest, [Path(o) for o in args.other_dirs])
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"fl-sim compare: {err}") from None
    out = Path(args.out) if args.out else honest / "compare"
    written = write_comparison(runs, out)
    print(table(runs))
    print(f"written: {', '.join(str(p) for p in written)}")
    return 0


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim compare`` on the top-level sub-command parsers."""
    cmd = sub.add_parser(
        "compare",
        help="a dishonest server's runs against the honest one's (same scenario and seed)",
    )
    cmd.add_argument("honest_dir", metavar="HONEST_DIR", help="the honest server's run")
    cmd.add_argument(
        "other_dirs", metavar="OTHER_DIR", nargs="+", help="runs under other server behaviours"
    )
    cmd.add_argument("--out", help="where compare.json/.txt/.png go (default: HONEST_DIR/compare)")
    cmd.set_defaults(func=_command)
