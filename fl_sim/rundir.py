"""The run directory: every file name of a run, and the JSON-lines helpers every writer and
reader of it uses (``fl-sim run``, ``flwr run`` through :mod:`fl_sim.apps.flower_app` or a
user's :class:`~fl_sim.audit.audited.AuditedStrategy`, ``fl-sim audit``, ``fl-sim report``).

A run of fl-sim's own federation has every file; the audit of a user's Flower app has what
needs no scenario (the audit's records, their grids and reconstructions, the report). A run
directory is resumable (``fl-sim audit``) when it holds :data:`UPDATES_DIR` and what the audit
was run with (:data:`SCENARIO`, or :data:`AUDITED` for an app of one's own), and reportable
(``fl-sim report``) when it holds :data:`ROUNDS` or :data:`AUDIT`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

log = logging.getLogger(__name__)

# The scenario as resolved and as typed (``{"resolved": ..., "typed": ...}``), and under
# ``fl-sim run`` the Flower runtime it ran on (``"runtime"``: ``flwr`` or ``legacy``).
SCENARIO = "scenario.json"
# An audit of one's own Flower app (AuditedStrategy), in place of a scenario: its settings,
# attacked layer, input shape, normalisation and seed.
AUDITED = "audited.json"
# The dataset actually used: source, input shape, classes, value range, normalisation.
DATA = "data.json"
# One row per round: the global model's test loss and accuracy (and central DP's epsilon).
ROUNDS = "rounds.jsonl"
# One row per client and round: what it declared, its status and, if left out, the reason.
CLIENTS = "clients.jsonl"
# One record per client, round and attack, appended as soon as it is known.
AUDIT = "audit.jsonl"
# Under secure aggregation, a record's ``view``: the attack on a round's sum, and the per-client
# records drawn from it.
COHORT_VIEW = "cohort"
AGGREGATE_VIEW = "aggregate"
# A record's ``status`` when its attack never finished: the run was interrupted while it ran,
# it was not done ``wait_s`` after the last round, its estimated memory exceeded the audit's
# budget (``audit.max_memory_gb``), it raised, or the attack refused the update (too large, not
# kept whole, ...). Any other status is the attack's own verdict.
INTERRUPTED = "interrupted"
TIMEOUT = "timeout"
OUT_OF_MEMORY = "out_of_memory"
ERROR = "error"
REFUSED = "refused"
# Of those, the ones a resumed audit redoes (their update is kept for it): cut short, not wrong.
RESUMABLE = frozenset({INTERRUPTED, TIMEOUT, OUT_OF_MEMORY})
# Per attacked batch, each sample's vulnerability proxies (``[audit] proxies``).
PROXIES = "proxies.jsonl"
# Derived from AUDIT and PROXIES at the end of an audit (rewritten, not appended).
FORECAST = "forecast.jsonl"
FORECAST_SAMPLES = "forecast_samples.jsonl"
# The global model after the last round (a torch state dict).
MODEL = "global_model.pt"
# The global model after the last round the server completed, with that round: what a run
# killed during training resumes from (``fl-sim run --resume``).
CHECKPOINT = "checkpoint.pt"
# Each client's own state after each of its rounds (its privacy ledger), for a resumed run.
CLIENT_STATE_DIR = "client_state"
REPORT = "report.html"
RUN_LOG = "run.log"
ACCURACY_PLOT = "accuracy.png"
PLOTS_DIR = "plots"
# Originals over reconstructions (images), or heat-maps of tabular records.
GRIDS_DIR = "grids"
# Every intercepted update until its records are written (for good with ``[audit]
# keep_updates``): what ``fl-sim audit`` resumes from.
UPDATES_DIR = "updates"
# Held (an OS file lock, released when its process ends however it ends) by the process that
# audits the run, with that process's pid: no two audits write one run's records.
AUDIT_LOCK = "audit.lock"
# Job inputs on their way to the attack workers; removed once judged.
JOBS_DIR = "jobs"
# Without ground truth: each reconstruction (inputs, certified mask), for the user to read.
RECONSTRUCTIONS_DIR = "reconstructions"

# ``fl-sim attack UPDATE.npz --out DIR``'s folder.
ATTACK_RESULT = "result.json"
ATTACK_RECONSTRUCTION = "reconstruction.npz"
ATTACK_GRID = "grid.png"


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON object as a line, flushed at once (an interrupted run keeps it). A last
    line torn by a crash is set aside first (:func:`set_aside_torn`), so the file stays one
    object a line."""
    set_aside_torn(path)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def set_aside_torn(path: Path) -> Path | None:
    """Move a last line cut short (no newline: the process died writing it) from ``path`` to
    ``PATH.torn-TIME``, with a warning; returns where it went (``None``: nothing torn)."""
    if not path.is_file() or path.stat().st_size == 0:
        return None
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return None
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    aside = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%d-%H%M%S')}")
    aside.write_bytes(data[cut:])
    with path.open("r+b") as f:
        f.truncate(cut)
    log.warning("%s: its last line was cut short by a crash; set aside in %s", path, aside.name)
    return aside


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Rewrite ``path`` with one JSON object a line (for derived files), whole or not at all."""
    _write_whole(path, "".join(json.dumps(row) + "\n" for row in rows))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (none if it does not exist). A last line cut short
    by a crash is left out, with a warning (the next append sets it aside)."""
    if not path.is_file():
        return []
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and not text.endswith("\n"):
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            log.warning("%s: its last line was cut short by a crash; left out", path)
            lines.pop()
    return [json.loads(line) for line in lines]


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write one JSON document, indented for reading, whole or not at all."""
    _write_whole(path, json.dumps(value, indent=2))


def _write_whole(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``: a crash
    leaves the old file or the new one, never half of one."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    os.replace(part, path)


def write_npz(path: Path, arrays: Mapping[str, Any]) -> None:
    """``np.savez`` of ``arrays`` to ``path``, whole or not at all (as :func:`_write_whole`)."""
    part = path.with_name(f".{path.name}.part")
    with part.open("wb") as f:
        np.savez(f, **arrays)
    os.replace(part, path)


def read_json(path: Path) -> dict[str, Any]:
    """One JSON document (empty if the file does not exist: a run that predates it)."""
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def write_scenario(
    run_dir: Path, scenario: BaseModel, resolved: dict[str, Any], runtime: str | None = None
) -> None:
    """``scenario.json``: the scenario as resolved (what ``fl-sim audit`` parses again to
    resume) and as typed (every default filled in); with ``runtime``, the Flower runtime
    ``fl-sim run`` ran it on (``flwr`` or ``legacy``)."""
    typed = scenario.model_dump(mode="json")
    written: dict[str, Any] = {"resolved": resolved, "typed": typed}
    if runtime is not None:
        written["runtime"] = runtime
    write_json(run_dir / SCENARIO, written)


def last_round(run_dir: Path) -> int:
    """The last round whose global model was tested (0: none trained)."""
    return max((row["round"] for row in read_jsonl(run_dir / ROUNDS)), default=0)


def is_run_dir(run_dir: Path) -> bool:
    """Whether ``run_dir`` can be reported: a federation's rounds, or an audit of one's own."""
    return any((run_dir / name).is_file() for name in (ROUNDS, AUDIT))


def new_run_dir(out: Path | None, name: str, root: Path = Path("runs")) -> Path:
    """A directory no earlier run wrote to: ``out`` if given (must not hold files), else
    ``root/NAME-YYYYmmdd-HHMMSS[-k]``."""
    if out is not None:
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(f"--out {out} already holds files: runs never overwrite")
        out.mkdir(parents=True, exist_ok=True)
        return out
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(1000):
        path = root / (f"{name}-{stamp}" + (f"-{k}" if k else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run directory under {root}")


def set_aside(*paths: Path) -> None:
    """Rename each JSON-lines file that exists to ``STEM-YYYYmmdd-HHMMSS.jsonl`` beside it
    (one time for all: kept, not overwritten, when an audit is redone)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for path in paths:
        if path.exists():
            path.rename(path.with_name(f"{path.stem}-{stamp}.jsonl"))
