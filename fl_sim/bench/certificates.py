"""``fl-sim bench certificates``: does SPEAR++ vouch only for right samples, and for every one?

Over a grid of networks where the batch is and is not identifiable from the first layer's
gradient (one hidden layer with 2, 3 or 10 classes, where any C samples' output gradients are
dependent; deeper image networks), float64 and float32 clients, one step and several, batches
below and above the class count, each row counts the samples the attack certified that are not
exact (wrong certificates: never acceptable) and the exact samples it did not certify.

Inputs are uniform on [0, 1), un-centred, as min-max scaled tables and raw pixels are fed. Each
update reaches the attack as the audit and ``fl-sim attack`` give it: the float64 difference of
the weights sent and received, over the learning rate, with the next layer's for a one-step
update. Ground truth stays here, the judge's side.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attacks import SpearConfig, reconstruct
from attacks.errors import AttackInputError
from clients import TrainingSettings, train_locally, training_settings
from fl_sim.audit.metrics import EXACT_DB, JUDGED, judge_certificates, match_and_score
from fl_sim.bench.invocation import command_line, results_folder
from fl_sim.bench.machine import machine, measured_header
from strategies import update_as_gradient

log = logging.getLogger(__name__)

DEFENCES: dict[str, TrainingSettings] = {
    "fedsgd": training_settings("fedsgd", lr=0.1),
    # Several local steps on mini-batches: the columns' zeros are taken at later weights.
    "fedavg": training_settings("fedavg", lr=0.05, epochs=3, mini_batch=2),
}
DTYPES = {"float64": torch.float64, "float32": torch.float32}
# Rows with more inputs than this are images (see CertificateRow.centred).
_TABLE_INPUTS = 100
_PRETRAIN_LR = 0.05
_PRETRAIN_BATCH = 32


@dataclass(frozen=True)
class CertificateRow:
    """One kind of network and client, attacked over several seeds.

    Parameters
    ----------
    inputs, width, depth, classes
        n, m, the number of linear layers (2: one hidden layer) and C.
    batch_size
        B.
    dtype
        The client's precision, ``float64`` or ``float32``.
    defence
        A key of :data:`DEFENCES`.
    pretrain_steps
        SGD steps (lr 0.05, batches of 32 other random inputs and labels) the network takes
        before the client's round: 0 attacks it at initialisation.
    """

    inputs: int
    width: int
    depth: int
    classes: int
    batch_size: int
    dtype: str
    defence: str
    pretrain_steps: int = 0

    def __post_init__(self) -> None:
        if self.depth < 2:
            raise ValueError(f"depth={self.depth}: at least 2 (one hidden layer)")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: allowed are {', '.join(DTYPES)}")
        if self.defence not in DEFENCES:
            raise ValueError(f"defence={self.defence!r}: allowed are {', '.join(DEFENCES)}")

    @property
    def name(self) -> str:
        return (
            f"n={self.inputs} m={self.width} depth={self.depth} C={self.classes} "
            f"B={self.batch_size} {self.dtype} {self.defence}"
            + (f" trained {self.pretrain_steps}" if self.pretrain_steps else "")
        )

    @property
    def centred(self) -> bool:
        """Image-sized inputs come normalised to [-1, 1), as pixels usually are; small ones
        un-centred on [0, 1), as min-max scaled tables are."""
        return self.inputs > _TABLE_INPUTS

    def draw(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` random inputs of this row, in the client's dtype."""
        x = torch.rand(count, self.inputs, generator=generator, dtype=DTYPES[self.dtype])
        return 2 * x - 1 if self.centred else x


def grid() -> list[CertificateRow]:
    """The default grid: small one-hidden-layer nets (as tabular apps are built) with 2, 3 and
    10 classes, B below and above C; a small binary net of depth 3; image-sized nets of depth
    3 and 6; each in float64 and float32, FedSGD and FedAvg. Then few-class tables trained 300
    steps, and float32 one-step image clients at initialisation and trained 100 steps."""
    shapes = [
        (20, 80, 2, 2, 4),
        (20, 80, 2, 2, 12),
        (20, 80, 2, 3, 2),
        (20, 80, 2, 3, 12),
        (20, 80, 2, 10, 4),
        (20, 80, 2, 10, 12),
        (20, 80, 3, 2, 8),
        (3072, 200, 3, 10, 4),
        (3072, 200, 3, 10, 20),
        (3072, 200, 6, 10, 4),
        (3072, 200, 6, 10, 20),
    ]
    rows = [
        CertificateRow(n, m, depth, c, b, dtype, defence)
        for n, m, depth, c, b in shapes
        for dtype in DTYPES
        for defence in DEFENCES
    ]
    # Few-class tables once the network has trained.
    rows += [
        CertificateRow(20, 80, 2, c, 12, dtype, "fedsgd", 300) for c in (2, 3) for dtype in DTYPES
    ]
    # Float32 one-step clients of a 10-class image net, at initialisation and trained.
    rows += [
        CertificateRow(3072, m, 2, 10, b, "float32", "fedsgd", steps)
        for b, m in ((20, 200), (32, 256), (64, 1000))
        for steps in (0, 100)
    ]
    return rows


def network(row: CertificateRow) -> nn.Sequential:
    """Linear + ReLU layers of width m, then a linear layer to the C classes."""
    widths = [row.inputs] + [row.width] * (row.depth - 1)
    layers: list[nn.Module] = []
    for fan_in, fan_out in itertools.pairwise(widths):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], row.classes))
    return nn.Sequential(*layers).to(DTYPES[row.dtype])


def attack_one(row: CertificateRow, seed: int, config: SpearConfig) -> dict[str, Any]:
    """Train one client of ``row`` on a random batch, attack its update, judge every sample."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = network(row)
    if row.pretrain_steps:
        optimiser = torch.optim.SGD(model.parameters(), lr=_PRETRAIN_LR)
        for _ in range(row.pretrain_steps):
            others = row.draw(_PRETRAIN_BATCH, generator)
            labels = torch.randint(0, row.classes, (_PRETRAIN_BATCH,), generator=generator)
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(others), labels).backward()
            optimiser.step()
        model.zero_grad()
    x = row.draw(row.batch_size, generator)
    y = torch.randint(0, row.classes, (row.batch_size,), generator=generator)
    first, second = model[0], model[2]
    assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
    params = (first.weight, first.bias, second.weight, second.bias)
    sent = [p.detach().double().clone() for p in params]
    settings = DEFENCES[row.defence]
    steps = train_locally(model, x, y, settings, generator).steps
    grads = [
        update_as_gradient(before, now.detach().double(), settings.lr)
        for before, now in zip(sent, params, strict=True)
    ]
    # A one-step update comes with the next layer's gradient, as the audit gives FedSGD's.
    nxt = (grads[2], grads[3], sent[2]) if steps == 1 else None
    started = time.perf_counter()
    try:
        rec = reconstruct(grads[0], grads[1], sent[0], sent[1], next_layer=nxt, config=config)
    except AttackInputError as err:
        # Refused, as the audit records it (a float32 multi-step update whose round-off fills
        # every live neuron's rank): nothing certified, nothing exact.
        return {
            "row": row.name,
            "seed": seed,
            "time_budget_s": config.time_budget_s,
            "status": "refused",
            "reason": str(err),
            "samples": row.batch_size,
            **dict.fromkeys(("certified", "exact", *JUDGED), 0),
            "psnr_min": None,
            "stray_zeros_max": None,
            "seconds": time.perf_counter() - started,
        }
    seconds = time.perf_counter() - started
    # Judged on [0, 1], where the audit's dB are read.
    shift = 1.0 if row.centred else 0.0
    quality = match_and_score(
        (rec.inputs + shift) / (1 + shift), (x.double() + shift) / (1 + shift)
    )
    judged = judge_certificates(
        (rec.inputs + shift) / (1 + shift), (x.double() + shift) / (1 + shift), rec.certified
    )
    return {
        "row": row.name,
        "seed": seed,
        "time_budget_s": config.time_budget_s,
        "status": rec.status,
        "reason": rec.reason,
        "samples": row.batch_size,
        "certified": int(rec.certified.sum()),
        "exact": int((quality.psnr >= EXACT_DB).sum()),
        **judged,
        "psnr_min": float(quality.psnr.min()),
        "stray_zeros_max": rec.summary()["stray_zeros_max"],
        "seconds": seconds,
    }


def summarise(row: CertificateRow, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the table from its attacks."""
    return {
        "row": row.name,
        **asdict(row),
        "attacks": len(runs),
        "samples": sum(r["samples"] for r in runs),
        "exact": sum(r["exact"] for r in runs),
        "certified": sum(r["certified"] for r in runs),
        "certified_not_exact": sum(r["certified_not_exact"] for r in runs),
        "certified_not_near_exact": sum(r["certified_not_near_exact"] for r in runs),
        "exact_uncertified": sum(r["exact_uncertified"] for r in runs),
        "updates_exact_uncertified": sum(r["exact_uncertified"] > 0 for r in runs),
        "statuses": dict(Counter(r["status"] for r in runs)),
        "seconds_mean": sum(r["seconds"] for r in runs) / max(1, len(runs)),
    }


def wrong_certificates(summaries: list[dict[str, Any]]) -> int:
    """Certified samples that are wrong: under 40 dB anywhere, under 100 dB in float64."""
    return sum(
        s["certified_not_exact"] if s["dtype"] == "float64" else s["certified_not_near_exact"]
        for s in summaries
    )


def markdown(summaries: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The results table, with where and how it was measured."""
    lines = [
        "# SPEAR++ certificates: wrong and missing",
        "",
        *measured_header(meta),
        "Per row: samples exact (>= 100 dB on [0, 1]), certified by the attack, certified but "
        "under 100 dB and under 40 dB of their true sample (a float32 client's certificate "
        "vouches for its round-off, which puts samples at 85 to 130 dB; under 40 dB is a wrong "
        "sample), exact but not certified, and updates with any exact sample left uncertified.",
        "",
        "| row | attacks | samples | exact | certified | cert. < 100 dB | cert. < 40 dB "
        "| exact uncertified | updates | statuses | s / attack |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in summaries:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items()))
        lines.append(
            f"| {s['row']} | {s['attacks']} | {s['samples']} | {s['exact']} | {s['certified']} "
            f"| {s['certified_not_exact']} | {s['certified_not_near_exact']} "
            f"| {s['exact_uncertified']} "
            f"| {s['updates_exact_uncertified']} | {statuses} | {s['seconds_mean']:.2f} |"
        )
    lines += ["", f"Wrong certificates over the grid: {wrong_certificates(summaries)}."]
    return "\n".join(lines) + "\n"


def finished_attacks(path: Path, config: SpearConfig) -> dict[tuple[str, int], dict[str, Any]]:
    """The attacks an earlier run of the same budget wrote to ``path``, by row and seed.

    A line cut short by a crash is left out (its attack runs again)."""
    done: dict[tuple[str, int], dict[str, Any]] = {}
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("time_budget_s") == config.time_budget_s:
            done[(record["row"], record["seed"])] = record
    return done


def run_certificates(
    rows: Iterable[CertificateRow], seeds: range, config: SpearConfig, out: Path, command: str
) -> list[dict[str, Any]]:
    """Attack every row over ``seeds``; each attack appended to ``attacks.jsonl`` as it ends,
    the table rewritten after each row. Attacks already in ``out`` at the same time budget are
    taken from there, so a run killed part-way resumes where it stopped."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": command,
        "hardware": machine(),
        "seeds": list(seeds),
        "attack": config.as_dict(),
    }
    path = out / "attacks.jsonl"
    done = finished_attacks(path, config)
    if done:
        log.info("resuming: %d attacks already in %s", len(done), path)
    if path.exists() and not path.read_bytes().endswith(b"\n"):
        with path.open("a") as cut:
            cut.write("\n")
    summaries: list[dict[str, Any]] = []
    with path.open("a") as attacks:
        for row in rows:
            runs = []
            for seed in seeds:
                record = done.get((row.name, seed))
                if record is None:
                    record = attack_one(row, seed, config)
                    attacks.write(json.dumps(record) + "\n")
                    attacks.flush()
                runs.append(record)
            summaries.append(summarise(row, runs))
            log.info(
                "%s: %d wrong certificates, %d exact uncertified",
                row.name,
                wrong_certificates(summaries[-1:]),
                summaries[-1]["exact_uncertified"],
            )
            meta["finished"] = time.strftime("%Y-%m-%d %H:%M")
            (out / "summary.json").write_text(json.dumps({**meta, "rows": summaries}, indent=1))
            (out / "summary.md").write_text(markdown(summaries, meta))
    return summaries


def add_command(bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fl-sim bench certificates`` on the ``bench`` sub-command parsers."""
    cmd = bench.add_parser(
        "certificates",
        help="wrong and missing SPEAR++ certificates over small and large networks",
    )
    cmd.add_argument("--seeds", type=int, default=20, help="seeds per row (0 to N-1)")
    cmd.add_argument("--only", default="", help="rows whose name contains this text")
    cmd.add_argument(
        "--time-budget", type=float, default=30.0, help="seconds per attack, as in the audit"
    )
    cmd.add_argument("--out", help="results folder (default: bench/runs/certificates-TIME)")
    cmd.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    if args.seeds < 1:
        raise SystemExit(f"fl-sim bench certificates: --seeds {args.seeds}: at least 1")
    rows = [row for row in grid() if args.only in row.name]
    if not rows:
        names = "; ".join(row.name for row in grid())
        raise SystemExit(f"fl-sim bench certificates: --only {args.only!r} matches none of {names}")
    try:
        config = SpearConfig(time_budget_s=args.time_budget)
    except ValueError as err:
        raise SystemExit(f"fl-sim bench certificates: {err}") from None
    out = results_folder(args.out, "certificates")
    summaries = run_certificates(rows, range(args.seeds), config, out, command_line())
    print((out / "summary.md").read_text())
    return 1 if wrong_certificates(summaries) else 0
