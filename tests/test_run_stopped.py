"""A run that stops early (Ctrl-C, an error) still ends with its summary and report, and a
stop ends the server's wait for replies that will not come."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message

from fl_sim import cli
from fl_sim.apps.interruption import InterruptibleGrid, Interruption, RunInterruptedError
from fl_sim.config import Scenario
from tests.helpers import UnusedGrid

CONFIG = (
    'rounds = 5\n[data]\nsource = "photos"\nsamples_per_client = 20\ntest_size = 40\n'
    "[model]\nwidth = 24\ndepth = 3\n[clients]\ncount = 2\nbatch_size = 6\n"
)


def _stopping_after_round_one(error: BaseException) -> Any:
    """A stand-in for the simulation that records round 1 (client 1 diverged), then stops."""

    def simulate(
        scenario: Scenario,
        run_dir: Path,
        interruption: Interruption,
        progress: Any,
        runtime: str = "flwr",
    ) -> None:
        rounds = [{"round": r, "test_loss": 2.3, "test_accuracy": 0.1} for r in (0, 1)]
        (run_dir / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
        clients = [
            {"round": 1, "client": 0, "status": "ok"},
            {"round": 1, "client": 1, "status": "diverged", "reason": "training loss is nan"},
        ]
        (run_dir / "clients.jsonl").write_text("".join(json.dumps(r) + "\n" for r in clients))
        raise error

    return simulate


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (KeyboardInterrupt(), 130, "fl-sim run: interrupted (Ctrl-C) after round 1 of 5"),
        (RuntimeError("Simulation Runtime crashed."), 1, "failed: RuntimeError: Simulation"),
    ],
)
def test_a_stopped_run_prints_its_summary_and_writes_its_report(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: BaseException,
    code: int,
    message: str,
) -> None:
    monkeypatch.setattr("fl_sim.run._simulate", _stopping_after_round_one(error))
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    run_dir = tmp_path / "run"
    assert cli.main(["-q", "run", str(config), "--out", str(run_dir)]) == code
    out, err = capsys.readouterr()
    assert message in err and str(run_dir / "report.html") in err
    assert "Left out of aggregation" in out and "training loss is nan" in out
    report = (run_dir / "report.html").read_text()
    assert "Rounds: 1 of 5 (the run stopped early)" in report and "diverged" in report


class _SilentGrid(UnusedGrid):
    """A grid whose nodes never answer (as after Ctrl-C stopped the clients), but for the
    messages it was told to answer."""

    def __init__(self, answered: set[str]) -> None:
        self.answered = answered
        self.pushed: list[str] = []

    def get_node_ids(self) -> list[int]:
        return [1, 2]

    def push_messages(self, messages: Any) -> list[str]:
        self.pushed = [str(m) for m in messages]
        return self.pushed

    def pull_messages(self, message_ids: Any) -> list[Message]:
        return [_Reply(i) for i in message_ids if i in self.answered]  # type: ignore[misc]

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        raise NotImplementedError


class _Reply:
    def __init__(self, reply_to: str) -> None:
        self.metadata = type("Metadata", (), {"reply_to_message_id": reply_to})()


def test_a_stop_ends_the_servers_wait_for_replies() -> None:
    interruption = Interruption()
    grid = InterruptibleGrid(_SilentGrid({"a", "b"}), interruption)
    assert len(list(grid.send_and_receive(["a", "b"]))) == 2  # type: ignore[arg-type]
    silent = InterruptibleGrid(_SilentGrid({"a"}), interruption)
    threading.Timer(0.3, interruption.request).start()
    started = time.monotonic()
    with pytest.raises(RunInterruptedError):
        silent.send_and_receive(["a", "b"])  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    with pytest.raises(RunInterruptedError):
        list(silent.get_node_ids())
    assert interruption.wait_done(0.1)  # the server never began: nothing to wait for
