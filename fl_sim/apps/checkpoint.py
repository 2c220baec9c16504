"""What a federation killed during training resumes from: the global model after each round the
server completed, and each client's own state (its privacy ledger) after each of its rounds, in
the run directory, each file written whole.

A client's state stands in for what a device keeps on its own storage: a resumed simulation
starts every client afresh, and the client restores its state as of the last round before the
one it is asked to train, so a round that is trained again is not spent twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fl_sim import rundir


def save_global(run_dir: Path, server_round: int, arrays: ArrayRecord) -> None:
    """Keep the global model after ``server_round`` (0: the initial one), replacing the last."""
    path = run_dir / rundir.CHECKPOINT
    partial = path.with_name(f".{path.name}.partial")
    torch.save({"round": server_round, "state_dict": arrays.to_torch_state_dict()}, partial)
    os.replace(partial, path)


def load_global(run_dir: Path) -> tuple[int, ArrayRecord] | None:
    """The last round the server completed and the global model after it (None: no round was
    completed, or the run is not resumable)."""
    path = run_dir / rundir.CHECKPOINT
    if not path.is_file():
        return None
    kept = torch.load(path, weights_only=True)
    return int(kept["round"]), ArrayRecord(kept["state_dict"])


class ClientStore:
    """Each client's state after each of its rounds, under ``run_dir/client_state/``.

    Only ConfigRecords of plain values are kept (fl-sim's defences keep their ledgers in them);
    a mod's own state of bytes (SecAgg+'s keys and shares) is not a client's to carry over.
    """

    def __init__(self, run_dir: Path) -> None:
        self.folder = run_dir / rundir.CLIENT_STATE_DIR

    def save(self, client: int, server_round: int, state: RecordDict) -> None:
        """Keep ``state`` as it is after ``client`` trained ``server_round``."""
        kept = {
            name: dict(record)
            for name, record in state.items()
            if isinstance(record, ConfigRecord) and _plain(record)
        }
        if not kept:
            return
        self.folder.mkdir(exist_ok=True)
        rundir.write_json(self.folder / f"c{client:04d}-r{server_round:04d}.json", kept)

    def restore(self, client: int, server_round: int, state: RecordDict) -> None:
        """Fill an empty ``state`` (a client started afresh) with ``client``'s as of its last
        round before ``server_round``; nothing when it has none or ``state`` is not empty."""
        if len(state) or not self.folder.is_dir():
            return
        earlier = sorted(
            p
            for p in self.folder.glob(f"c{client:04d}-r*.json")
            if int(p.stem.rsplit("-r", 1)[1]) < server_round
        )
        if earlier:
            kept = json.loads(earlier[-1].read_text())
            for name, record in kept.items():
                state[name] = ConfigRecord(record)


def _plain(record: ConfigRecord) -> bool:
    """Whether every value of ``record`` is a JSON value (no bytes)."""
    try:
        json.dumps(dict(record))
    except TypeError:
        return False
    return True
