"""The audit log: what the audit writes to a run directory, and the vocabulary of its records.

``audit.jsonl`` gets one record per client, round and attack run (appended as soon as it is
known, each saying the server behaviour), ``proxies.jsonl`` one row per batch whose proxies
were computed, ``grids/`` the originals over their matched reconstructions (or, without ground
truth, the reconstructions alone, beside each one under ``reconstructions/``), ``updates/``
the intercepted updates a resumed audit attacks; ``jobs/`` holds each job's arrays until its
record is filed. File names are :mod:`fl_sim.rundir`'s.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from clients.defences import defence_label
from clients.defences.base import STEPS, declared_count
from clients.reply import TAMPER_FLAGGED, TRAIN_LOSS
from fl_sim import rundir
from fl_sim.audit.grid import save_grid, save_row
from fl_sim.audit.heatmap import save_heatmap
from fl_sim.data.normalize import Normalization
from fl_sim.forecast.table import joined_samples, record_run, round_correlations

# Every record carries these (None where no reconstruction was scored).
METRIC_KEYS = (
    "batch_size_estimated", "psnr_mean", "psnr_min", "share_exact", "share_near_exact",
    "ssim_mean", "seconds",
)  # fmt: skip
# The run label of the judge's proxy jobs (an attack run's is its attack's, with the loss).
PROXY_RUN = "proxies"
# Under secure aggregation: the record of the attack on a round's sum (its ``client``).
COHORT = -1


def file_stem(record: Mapping[str, Any]) -> str:
    """``rRRR-cCCC``: the stem of every file of a record (its update, job, grid)."""
    return f"r{record['round']:03d}-c{record['client']:03d}"


def new_record(
    server_round: int, client: int, node_id: int | None, defence: str, epsilon: float | None
) -> dict[str, Any]:
    """The fields every record starts with, whoever it is of (a client, a cohort), in the
    order every record lists them."""
    return {
        **dict.fromkeys(METRIC_KEYS),
        "round": server_round,
        "client": client,
        "node_id": node_id,
        "defence": defence,
        "epsilon": epsilon,
    }


def reply_record(
    server_round: int,
    node_id: int,
    client: int,
    declared: Mapping[str, Any],
    batch_size: int | None,
    epsilon: float | None,
) -> dict[str, Any]:
    """What every record of a client's reply says, whatever became of it: ``declared`` (what
    the client said of itself, its training loss left out), the true ``batch_size`` (ground
    truth: None where the client sent no sample ids) and its own check of the model it was
    sent (``tamper_flagged``, None where it did not say)."""
    return {
        **new_record(server_round, client, node_id, defence_label(declared), epsilon),
        "declared": {k: v for k, v in declared.items() if k != TRAIN_LOSS},
        "batch_size": batch_size,
        "tamper_flagged": declared.get(TAMPER_FLAGGED),
    }


# What a bulk in the update's spectrum beyond the batch's rank means, given what the client
# declared of its local steps: one gradient plus noise, or no single gradient at all.
SEVERAL_STEPS = "several local steps"
UNDECLARED_NOISE = "undeclared noise"
NOISE_OR_STEPS = "noise or several local steps"


def spectrum_bulk(bulk: bool | None, declared: Mapping[str, Any]) -> str | None:
    """The record's reading of a bulk the attack was not told of (``bulk``): several local
    steps where the client declared more than one (the update is then no single gradient), noise
    where it declared one, either where it declared nothing (a Flower app of one's own)."""
    if not bulk:
        return None
    steps = declared_count(declared, STEPS)
    if steps is None:
        return NOISE_OR_STEPS
    return SEVERAL_STEPS if steps > 1 else UNDECLARED_NOISE


def attack_fields(summary: Mapping[str, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """What the attack said of its reconstruction, without ground truth; ``declared``: what
    the client said of itself (its local steps name a bulk in the spectrum)."""
    bulk = spectrum_bulk(summary.get("undeclared_noise"), declared)
    return {
        "status": summary["status"],
        "reason": summary["reason"],
        "batch_size_estimated": summary["batch_size"],
        "batch_size_method": summary["batch_size_method"],
        # What the attack inferred of the batch size and the noise from the spectrum.
        "batch_size_confidence": summary.get("batch_size_confidence"),
        "noise_std_estimated": summary.get("noise_std_estimated"),
        "noise_std_used": summary.get("noise_std_used"),
        "undeclared_noise": None if bulk == NOISE_OR_STEPS else bulk == UNDECLARED_NOISE,
        "spectrum_bulk": bulk,
        "noise_note": summary.get("noise_note"),
        # What the attack vouches for without ground truth: columns (each one sample's
        # output gradient) and samples (inputs), beside what the judge found.
        "columns_verified": summary["verified"],
        "certified": summary["certified"],
        "confidence_mean": summary["confidence_mean"],
        "timings": summary["timings"],
        "counts": summary["counts"],
    }


class AuditBusyError(RuntimeError):
    """Another live process audits the run directory."""


class AuditLog:
    """The audit's files in one run directory.

    Parameters
    ----------
    run_dir
        The run directory.
    behaviour
        The server behaviour, said by every record.
    grids
        Whether to draw grids.
    input_shape, normalization
        Without ground truth: one input's shape (C x H x W images get grids of their
        reconstructions) and the normalisation to undo in them (none: each image stretched
        to [0, 1]).
    lock
        Take the run's audit lock (:meth:`lock`) for the auditor that writes the records.
    """

    def __init__(
        self,
        run_dir: Path,
        behaviour: str = "honest",
        grids: bool = True,
        input_shape: tuple[int, ...] | None = None,
        normalization: Normalization | None = None,
        lock: bool = False,
    ) -> None:
        self.run_dir = run_dir
        self.behaviour = behaviour
        self.grids = grids
        self.input_shape = input_shape
        self.normalization = normalization
        self._lock: IO[str] | None = None
        # (round, client) of the updates a job was cut short on: kept for a resumed audit.
        self._cut_short: set[tuple[int, int]] = set()
        if lock:
            self.lock()

    def lock(self) -> None:
        """Take the run's audit lock for this process (see :data:`fl_sim.rundir.AUDIT_LOCK`).

        Raises
        ------
        AuditBusyError
            When a live process holds it, naming that process.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        held = (self.run_dir / rundir.AUDIT_LOCK).open("a+")
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.seek(0)
            holder = held.read().strip() or "?"
            held.close()
            raise AuditBusyError(
                f"{self.run_dir} is being audited by process {holder}: wait for it to end, or "
                "stop it, before auditing the run again"
            ) from None
        held.seek(0)
        held.truncate()
        held.write(str(os.getpid()))
        held.flush()
        self._lock = held

    def unlock(self) -> None:
        """Let go of the run's audit lock."""
        if self._lock is not None:
            self._lock.close()  # closing the file releases its lock
            self._lock = None

    def done(self) -> set[tuple[int, int, str]]:
        """(round, client, run) of every record and proxy row on file but those cut short
        (:data:`~fl_sim.rundir.RESUMABLE`): what a resumed audit does not redo."""
        done = {
            (r["round"], r["client"], record_run(r))
            for r in self.records()
            if r.get("status") not in rundir.RESUMABLE
        }
        rows = rundir.read_jsonl(self.run_dir / rundir.PROXIES)
        return done | {
            (r["round"], r["client"], PROXY_RUN)
            for r in rows
            if r.get("status") not in rundir.RESUMABLE
        }

    def forget_cut_short(self) -> int:
        """Drop the records and proxy rows cut short (interrupted, timed out) whose update is
        stored, before a resumed audit redoes them, so that each (round, client, run) keeps one
        record; returns how many were dropped. Each file is rewritten whole: a kill meanwhile
        leaves the old one or the new one, and a dropped job is redone either way."""
        dropped = 0
        for name in (rundir.AUDIT, rundir.PROXIES):
            path = self.run_dir / name
            rows = rundir.read_jsonl(path)
            kept = [
                r
                for r in rows
                if r.get("status") not in rundir.RESUMABLE or not self.update_path(r).is_file()
            ]
            if len(kept) < len(rows):
                rundir.write_jsonl(path, kept)
                dropped += len(rows) - len(kept)
        return dropped

    def records(self) -> list[dict[str, Any]]:
        """The records of ``audit.jsonl``."""
        return rundir.read_jsonl(self.run_dir / rundir.AUDIT)

    def set_aside(self) -> None:
        """Keep the records and proxy rows so far under a time-stamped name, for a redo."""
        rundir.set_aside(self.run_dir / rundir.AUDIT, self.run_dir / rundir.PROXIES)

    def update_path(self, base: Mapping[str, Any]) -> Path:
        """Where an intercepted update is kept."""
        return self.run_dir / rundir.UPDATES_DIR / f"{file_stem(base)}.npz"

    def release_update(
        self, record: Mapping[str, Any], pending: Collection[tuple[int, int, str]], keep: bool
    ) -> None:
        """Remove the stored copy of ``record``'s update once none of its jobs is ``pending``
        (it was stored so that a hard kill loses no queued attack), unless ``keep``; the
        update of a job cut short (:data:`~fl_sim.rundir.RESUMABLE`) stays for a resumed
        audit."""
        key = (record["round"], record["client"])
        if record.get("status") in rundir.RESUMABLE:
            self._cut_short.add(key)
        if not keep and key not in self._cut_short and not any(p[:2] == key for p in pending):
            self.update_path(record).unlink(missing_ok=True)

    def stored_updates(self) -> list[Path]:
        """The kept updates, in round and client order."""
        return sorted((self.run_dir / rundir.UPDATES_DIR).glob("r*-c*.npz"))

    def job_path(self, record: Mapping[str, Any], run: str) -> Path:
        """Where the arrays of a job of ``run`` on ``record``'s update wait for a worker."""
        return self.run_dir / rundir.JOBS_DIR / f"{file_stem(record)}-{run}.npz"

    def write(self, record: Mapping[str, Any], run: str | None = None) -> None:
        """Append a record (with the server behaviour); a job's (``run``) has its arrays
        removed."""
        row = {**record, "server_behaviour": self.behaviour}
        rundir.append_jsonl(self.run_dir / rundir.AUDIT, row)
        if run is not None:
            self.job_path(record, run).unlink(missing_ok=True)

    def write_proxies(self, row: Mapping[str, Any]) -> None:
        """Append a proxy row; its job's arrays are removed."""
        rundir.append_jsonl(self.run_dir / rundir.PROXIES, dict(row))
        self.job_path(row, PROXY_RUN).unlink(missing_ok=True)

    def grid(
        self,
        record: dict[str, Any],
        run: str,
        truth: np.ndarray,
        matched: np.ndarray,
        image: bool,
    ) -> None:
        """Save the originals over their matched reconstructions (images side by side,
        tabular records as a heat-map of the B x n matrix); name it in ``record``."""
        if not self.grids or not len(truth):
            return
        name = _grid_name(record, run)
        (save_grid if image else save_heatmap)(
            truth, matched, self.run_dir / rundir.GRIDS_DIR / name
        )
        record["grid"] = f"{rundir.GRIDS_DIR}/{name}"

    def reconstruction(
        self, record: dict[str, Any], run: str, inputs: np.ndarray, certified: np.ndarray
    ) -> None:
        """Save a reconstruction no ground truth judges (and, for images, its grid); name
        them in ``record``."""
        name = file_stem(record)
        path = self.run_dir / rundir.RECONSTRUCTIONS_DIR / f"{name}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, inputs=inputs, certified=certified)
        record["reconstruction"] = f"{rundir.RECONSTRUCTIONS_DIR}/{name}.npz"
        shape = self.input_shape
        if not (self.grids and len(inputs) and shape is not None and len(shape) == 3):
            return
        images = torch.from_numpy(inputs).reshape(-1, *shape)
        if self.normalization is not None:
            images = self.normalization.undo(images)
        else:  # unknown normalisation: each image stretched to [0, 1], to be seen at all
            low = images.amin(dim=(1, 2, 3), keepdim=True)
            images = (images - low) / (images.amax(dim=(1, 2, 3), keepdim=True) - low).clamp(
                min=1e-12
            )
        grid = _grid_name(record, run)
        save_row(images.numpy(), self.run_dir / rundir.GRIDS_DIR / grid)
        record["grid"] = f"{rundir.GRIDS_DIR}/{grid}"

    def close(self) -> None:
        """The audit is over: remove what is left of the jobs' arrays, let go of the lock."""
        shutil.rmtree(self.run_dir / rundir.JOBS_DIR, ignore_errors=True)
        self.unlock()

    def write_forecast(self) -> Path:
        """``forecast_samples.jsonl``: per sample, its proxies beside the MSE and PSNR of every
        attack run that scored it; ``forecast.jsonl``: per round and optimisation-attack run
        (then over all rounds), the Spearman correlation of each proxy with the attack's MSE.
        Both are rewritten from ``audit.jsonl`` and ``proxies.jsonl`` each time (derived, not
        records)."""
        proxies = rundir.read_jsonl(self.run_dir / rundir.PROXIES)
        samples = joined_samples(self.records(), proxies)
        rundir.write_jsonl(self.run_dir / rundir.FORECAST_SAMPLES, samples)
        path = self.run_dir / rundir.FORECAST
        rundir.write_jsonl(path, round_correlations(samples))
        return path


def _grid_name(record: Mapping[str, Any], run: str) -> str:
    # SPEAR++'s grids keep the names they had before there were other attacks.
    return file_stem(record) + (".png" if run == "spearpp" else f"-{run}.png")
