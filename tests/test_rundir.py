"""The run directory: its JSON-lines helpers; a ``flwr run``-style run directory (a user's
strategy wrapped in AuditedStrategy, no ground truth) made of rundir's names only, read by
``fl-sim report`` and resumed by ``fl-sim audit``; and fl-sim's own app under ``flwr run``
leaving the scenario that resumes it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fl_sim import rundir
from fl_sim.apps import flower_app
from fl_sim.audit.audited import AuditedStrategy
from fl_sim.audit.reaudit import reaudit
from fl_sim.cli import main
from fl_sim.config import load_scenario, parse_scenario
from fl_sim.config.schema import AuditSpec
from tests.helpers import UnusedGrid

# Every name rundir gives a file or folder of a run directory.
NAMES = {v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str)}


def test_jsonl_round_trip_and_run_dir_rules(tmp_path: Path) -> None:
    path = tmp_path / rundir.AUDIT
    assert rundir.read_jsonl(path) == [] and rundir.last_round(tmp_path) == 0
    rundir.append_jsonl(path, {"round": 1, "x": [1, 2]})
    rundir.append_jsonl(path, {"round": 2, "x": None})
    assert rundir.read_jsonl(path) == [{"round": 1, "x": [1, 2]}, {"round": 2, "x": None}]
    assert rundir.is_run_dir(tmp_path) and not rundir.is_run_dir(tmp_path / "none")
    rundir.write_jsonl(tmp_path / rundir.ROUNDS, [{"round": 0}, {"round": 3}])
    assert rundir.last_round(tmp_path) == 3
    rundir.set_aside(path, tmp_path / rundir.PROXIES)  # the missing one is left alone
    (kept,) = tmp_path.glob("audit-*.jsonl")
    assert not path.exists() and len(rundir.read_jsonl(kept)) == 2
    assert rundir.read_json(tmp_path / rundir.SCENARIO) == {}
    fresh = rundir.new_run_dir(None, "run", root=tmp_path)
    assert fresh.parent == tmp_path and fresh.name.startswith("run-")
    with pytest.raises(FileExistsError, match="already holds files"):
        rundir.new_run_dir(tmp_path, "run")


class _LocalClients(UnusedGrid):
    """Two in-process clients, each of which takes one SGD step of a plain PyTorch model on a
    fresh batch of 8 random 8 x 8 images and replies as a Flower ClientApp would (as the
    example app's clients do, at its learning rate)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.generator = torch.Generator().manual_seed(0)

    def get_node_ids(self) -> list[int]:
        return [101, 202]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return [self._train(m) for m in messages]

    def _train(self, msg: Message) -> Message:
        arrays = msg.content["arrays"]
        assert isinstance(arrays, ArrayRecord)
        self.model.load_state_dict(arrays.to_torch_state_dict())
        x = (torch.rand(8, 1, 8, 8, generator=self.generator) - 0.3) / 0.4
        y = torch.arange(8)
        nn.functional.cross_entropy(self.model(x), y).backward()
        with torch.no_grad():
            for p in self.model.parameters():
                p -= 0.5 * p.grad  # type: ignore[operator]
                p.grad = None
        content = RecordDict(
            {
                "arrays": ArrayRecord(self.model.state_dict()),
                "metrics": MetricRecord({"num-examples": 8}),
            }
        )
        return Message(content, reply_to=msg)


def test_audited_flower_app_run_dir_is_rundirs_and_reportable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a ``flwr run`` of a user's app audited by AuditedStrategy leaves: only rundir's
    names; every update attacked without ground truth; ``fl-sim report`` rebuilds its report."""
    # The identity a ServerApp process gets from Flower's runtime (messages are stamped with it).
    for key, value in {"_task_id": 1, "_run_id": 1, "_node_id": 0}.items():
        monkeypatch.setattr(TaskIdentity, key, value)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 200), nn.ReLU(), nn.Linear(200, 10))
    run_dir = tmp_path / "app-run"
    strategy = AuditedStrategy(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=2),
        run_dir,
        model=model,
        input_shape=(1, 8, 8),
        mean=(0.3,),
        std=(0.4,),
        settings=AuditSpec(workers=1, spearpp={"time_budget_s": 30.0}, keep_updates=True),
    )
    strategy.start(
        grid=_LocalClients(model), initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2
    )
    found = {p.name for p in run_dir.iterdir()}
    assert found <= NAMES, found - NAMES
    assert {rundir.AUDIT, rundir.REPORT, rundir.GRIDS_DIR, rundir.RECONSTRUCTIONS_DIR} <= found
    records = rundir.read_jsonl(run_dir / rundir.AUDIT)
    assert sorted((r["round"], r["client"]) for r in records) == [
        (1, 101), (1, 202), (2, 101), (2, 202)
    ]  # fmt: skip
    assert all(r["psnr_mean"] is None and r["batch_size"] is None for r in records)
    assert all(r["status"] == "exact" and r["certified"] == 8 for r in records), records
    for r in records:
        assert r["reconstruction"].startswith(f"{rundir.RECONSTRUCTIONS_DIR}/")
        assert r["grid"].startswith(f"{rundir.GRIDS_DIR}/") and (run_dir / r["grid"]).is_file()
    (run_dir / rundir.REPORT).unlink()
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / rundir.REPORT).is_file()
    # Resumable: an audit interrupted after two records attacks the two other stored updates.
    lines = (run_dir / rundir.AUDIT).read_text().splitlines(keepends=True)
    (run_dir / rundir.AUDIT).write_text("".join(lines[:2]))
    assert reaudit(run_dir) == 2
    resumed = rundir.read_jsonl(run_dir / rundir.AUDIT)
    assert sorted((r["round"], r["client"]) for r in resumed) == sorted(
        (r["round"], r["client"]) for r in records
    )
    assert all(r["status"] == "exact" and r["certified"] == 8 for r in resumed)
    assert {p.name for p in run_dir.iterdir()} <= NAMES


def test_flwr_run_of_fl_sims_app_writes_its_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``flwr run`` fl-sim's own ServerApp writes the scenario ``fl-sim audit`` resumes
    from, as ``fl-sim run`` does (and its recorder writes ``data.json``, as under fl-sim run)."""
    ran: list[Path] = []
    monkeypatch.setattr(
        flower_app, "run_federation", lambda g, c, s, run_dir, **_: ran.append(run_dir)
    )
    config = {"scenario": "configs/quickstart.toml", "out": str(tmp_path)}
    flower_app.main(None, Context(1, 0, {}, RecordDict(), config))  # type: ignore[arg-type]
    (run_dir,) = ran
    assert run_dir.parent == tmp_path and [p.name for p in run_dir.iterdir()] == [rundir.SCENARIO]
    scenario, resolved = load_scenario(flower_app.APP_DIR / "configs" / "quickstart.toml")
    kept = rundir.read_json(run_dir / rundir.SCENARIO)
    assert kept["resolved"] == resolved and parse_scenario(kept["resolved"]) == scenario


def test_a_line_torn_by_a_crash_is_left_out_then_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / rundir.AUDIT
    rundir.append_jsonl(path, {"round": 1})
    with path.open("a") as f:
        f.write('{"round": 2, "sta')  # the process died here
    assert rundir.read_jsonl(path) == [{"round": 1}]
    assert "cut short by a crash; left out" in caplog.text
    rundir.append_jsonl(path, {"round": 2})
    assert rundir.read_jsonl(path) == [{"round": 1}, {"round": 2}]
    (torn,) = tmp_path.glob(f"{rundir.AUDIT}.torn-*")
    assert torn.read_text() == '{"round": 2, "sta'


def test_json_files_are_replaced_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / rundir.SCENARIO
    rundir.write_json(path, {"a": 1})

    def killed(*_: object) -> None:
        raise KeyboardInterrupt  # the process dies between writing and renaming

    monkeypatch.setattr(rundir.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        rundir.write_json(path, {"a": 2})
    assert rundir.read_json(path) == {"a": 1}  # the old file, whole
