"""What a federation killed during training resumes from: the global model after the last
round the server completed, each client's state as of its last round before the one it is
asked to train, and Flower's rounds renumbered after the resumed round."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_sim.apps.checkpoint import ClientStore, load_global, save_global
from fl_sim.audit.updates import stored_updates
from fl_sim.rundir import CHECKPOINT, write_npz
from strategies import RoundOffset


def test_the_global_model_of_the_last_completed_round_is_kept_whole(tmp_path: Path) -> None:
    assert load_global(tmp_path) is None
    for server_round in (0, 1, 2):
        weights = {"w": torch.full((2, 3), float(server_round))}
        save_global(tmp_path, server_round, ArrayRecord(weights))
    kept = load_global(tmp_path)
    assert kept is not None and kept[0] == 2
    assert np.array_equal(kept[1].to_numpy_ndarrays()[0], np.full((2, 3), 2.0))
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT]  # no partial file left


def test_a_client_restores_its_state_as_of_its_last_round_before_this_one(tmp_path: Path) -> None:
    store = ClientStore(tmp_path)
    for server_round, spent in ((1, [1.0]), (2, [1.0, 2.0]), (3, [1.0, 2.0, 3.0])):
        store.save(7, server_round, RecordDict({"ledger": ConfigRecord({"noise": spent})}))
    fresh = RecordDict()
    store.restore(7, 3, fresh)  # round 3 trained again: its own spending is not restored
    assert fresh["ledger"]["noise"] == [1.0, 2.0]
    other = RecordDict()
    store.restore(8, 3, other)  # another client's is not its own
    assert len(other) == 0
    first = RecordDict()
    store.restore(7, 1, first)  # nothing before round 1
    assert len(first) == 0
    live = RecordDict({"ledger": ConfigRecord({"noise": [9.0]})})
    store.restore(7, 4, live)  # a client that lived on keeps what it holds
    assert live["ledger"]["noise"] == [9.0]


class _Recorder:
    """A strategy that notes the rounds it is told."""

    def __init__(self) -> None:
        self.rounds: list[tuple[str, int]] = []

    def configure_train(self, server_round: int, *args: Any) -> list[Message]:
        self.rounds.append(("configure_train", server_round))
        return []

    def aggregate_train(self, server_round: int, replies: Any) -> tuple[None, None]:
        self.rounds.append(("aggregate_train", server_round))
        return None, None

    def configure_evaluate(self, server_round: int, *args: Any) -> list[Message]:
        self.rounds.append(("configure_evaluate", server_round))
        return []

    def aggregate_evaluate(self, server_round: int, replies: Any) -> MetricRecord | None:
        self.rounds.append(("aggregate_evaluate", server_round))
        return None


def test_flowers_rounds_run_as_the_rounds_after_the_resumed_one() -> None:
    inner = _Recorder()
    offset = RoundOffset(inner, 3)  # type: ignore[arg-type]
    config = ConfigRecord()
    offset.configure_train(1, ArrayRecord(), config, None)  # type: ignore[arg-type]
    offset.aggregate_train(1, [])
    offset.configure_evaluate(2, ArrayRecord(), config, None)  # type: ignore[arg-type]
    offset.aggregate_evaluate(2, [])
    assert inner.rounds == [
        ("configure_train", 4),
        ("aggregate_train", 4),
        ("configure_evaluate", 5),
        ("aggregate_evaluate", 5),
    ]


def test_an_update_is_written_whole_and_a_torn_one_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r001-c000.npz"
    write_npz(path, {"a": np.arange(3)})

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # the process dies while writing

    monkeypatch.setattr(np, "savez", killed)
    with pytest.raises(KeyboardInterrupt):
        write_npz(path, {"a": np.arange(5)})
    monkeypatch.undo()
    with np.load(path) as kept:
        assert kept["a"].tolist() == [0, 1, 2]  # the old file, whole
    torn = tmp_path / "r002-c000.npz"
    torn.write_bytes(b"PK\x03\x04 cut short")  # what a kill left before writes were whole
    with caplog.at_level(logging.WARNING):
        assert list(stored_updates([torn])) == []
    assert (tmp_path / "r002-c000.npz.torn").is_file() and not torn.exists()
    assert "cannot be read" in caplog.text and "set aside" in caplog.text
