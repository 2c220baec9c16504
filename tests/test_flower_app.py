"""The drop-in audit of a user's own Flower app: ``examples/flower-app`` (its own model, its own
plain PyTorch ClientApp) run by ``flwr run`` on Flower's deployment runtime on loopback, its
records checked; and the layer search's refusals."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from sklearn.datasets import load_digits
from torch import nn

from fl_sim.apps.flwr_simulation import free_port
from fl_sim.audit.audited import AuditedStrategy, AuditError, find_layer
from fl_sim.audit.auditor import Auditor
from fl_sim.audit.context import AuditContext
from fl_sim.cli import main
from fl_sim.config.schema import AuditSpec
from fl_sim.data.normalize import Normalization
from strategies import InterceptedUpdate
from tests.processes import VENV_BIN, Processes

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-app"
MLP_APP = APP.parent / "flower-mlp"
# The example's normalisation and test split (its own module, not fl-sim's).
MEAN, STD, TEST_SIZE = (0.3,), (0.4,), 300


def _arrays(model: nn.Module) -> ArrayRecord:
    return ArrayRecord(model.state_dict())


def test_find_layer_first_linear_and_named() -> None:
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(64, 20), nn.ReLU(), nn.Linear(20, 10))
    assert find_layer(_arrays(mlp)) == ("1.weight", "1.bias")
    assert find_layer(_arrays(mlp), model=mlp) == ("1.weight", "1.bias")
    assert find_layer(_arrays(mlp), layer="3") == ("3.weight", "3.bias")


def test_find_layer_refuses_what_it_cannot_attack() -> None:
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 10))
    with pytest.raises(AuditError, match=r"the first array is 0.weight \(4, 1, 3, 3\), not a"):
        find_layer(_arrays(cnn))
    with pytest.raises(
        AuditError, match=r"model: the input reaches Conv2d '0' before any nn\.Linear"
    ):
        find_layer(_arrays(cnn), model=cnn)
    with pytest.raises(AuditError, match=r"layer='fc': no arrays fc.weight, fc.bias \(arrays: 0"):
        find_layer(_arrays(cnn), layer="fc")
    with pytest.raises(AuditError, match=r"0.weight \(4, 1, 3, 3\) and 0.bias \(4,\) are not"):
        find_layer(_arrays(cnn), layer="0")
    sigmoid = nn.Sequential(nn.Linear(8, 4), nn.Sigmoid(), nn.Linear(4, 2))
    with pytest.raises(AuditError, match="followed by Sigmoid '1', not ReLU"):
        find_layer(_arrays(sigmoid), model=sigmoid)


def test_audited_strategy_refuses_ground_truth_attacks(tmp_path: Path) -> None:
    from flwr.serverapp.strategy import FedAvg

    with pytest.raises(AuditError, match=r"settings.attacks=\['inversion'\]"):
        AuditedStrategy(FedAvg(), tmp_path, settings=AuditSpec(attacks=("inversion",)))
    with pytest.raises(AuditError, match="mean and std go together"):
        AuditedStrategy(FedAvg(), tmp_path, mean=(0.5,))


def test_audit_without_ground_truth_and_its_report(tmp_path: Path) -> None:
    """One float32 SGD step of 8 images, as a user's own client would send it: the record holds
    what the attack knows, the reconstruction matches the originals (kept apart), and
    ``fl-sim report`` reads the run."""
    rng = np.random.default_rng(0)
    originals = rng.standard_normal((8, 3 * 8 * 8)).astype(np.float32)
    model = nn.Sequential(nn.Linear(192, 200), nn.ReLU(), nn.Linear(200, 10))
    sent = {k: v.detach().numpy().copy() for k, v in model[0].named_parameters()}
    loss = nn.functional.cross_entropy(model(torch.from_numpy(originals)), torch.arange(8))
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    update = InterceptedUpdate(
        server_round=1,
        node_id=12345,
        declared={},
        sent_weight=sent["weight"],
        sent_bias=sent["bias"],
        weight=model[0].weight.detach().numpy(),
        bias=model[0].bias.detach().numpy(),
    )
    spec = AuditSpec(spearpp={"starts": 500, "steps": 500, "max_passes": 2})
    auditor = Auditor(
        AuditContext(
            spec,
            tmp_path,
            0,
            layer=("0.weight", "0.bias"),
            input_shape=(3, 8, 8),
            normalization=Normalization((0.5,) * 3, (0.2,) * 3),
        )
    )
    auditor(update)
    auditor.finish()
    (record,) = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert record["status"] == "exact" and record["client"] == 12345
    assert record["batch_size_estimated"] == record["certified"] == 8
    assert record["share_certified"] == 1.0 and record["batch_size"] is None
    assert all(record[k] is None for k in ("psnr_mean", "share_exact", "ssim_mean"))
    with np.load(tmp_path / record["reconstruction"]) as rec:
        d = np.abs(rec["inputs"][:, None, :] - originals[None]).max(axis=2)
        assert rec["certified"].all() and d.min(axis=0).max() < 1e-4 * np.abs(originals).max()
    assert (tmp_path / record["grid"]).is_file()
    assert main(["report", str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    assert "12345" in html and "data:image/png" in html


def test_auditor_without_data_refuses_the_judges_attacks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without ground truth only attacks that certify"):
        Auditor(AuditContext(AuditSpec(proxies=True), tmp_path, 0))


def _flwr_run(tmp_path: Path, app: Path, rounds: int) -> tuple[Path, str]:
    """``app`` run by ``flwr run`` on loopback (a SuperLink, two SuperNodes with partitions 0
    and 1) for ``rounds``; its run directory and flwr run's output."""
    link = free_port()
    flwr_home = tmp_path / "flwr"
    flwr_home.mkdir()
    (flwr_home / "config.toml").write_text(
        f'[superlink.loopback]\naddress = "127.0.0.1:{link}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    }
    superlink = [
        *(str(VENV_BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1"),
        *("--port", str(link), "--disable-runtime-dependency-installation"),
    ]
    run_dir = tmp_path / "run"
    flwr_run = [
        *(str(VENV_BIN / "flwr"), "run", str(app), "loopback", "--stream"),
        *("--run-config", f"num-server-rounds={rounds} run-dir='{run_dir}'"),
    ]
    procs = Processes(tmp_path)
    try:
        procs.start("superlink", superlink, env)
        procs.wait_log("superlink", "Application startup complete", 60)
        for pid in (0, 1):
            node = [
                *(str(VENV_BIN / "flower-supernode"), "--insecure", "--host", "127.0.0.1"),
                *("--superlink", f"127.0.0.1:{link}", "--port", str(free_port())),
                *("--node-config", f"partition-id={pid} num-partitions=2"),
            ]
            procs.start(f"supernode{pid}", node, env)
        run = subprocess.run(flwr_run, env=env, capture_output=True, text=True, timeout=420)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        procs.stop()
    out = run.stdout + run.stderr
    (tmp_path / "flwr-run.txt").write_text(out)  # kept with pytest's temporary folders
    return run_dir, out


def _records_of_partitions(run_dir: Path, out: str, rounds: int) -> list[dict[str, Any]]:
    """The run's records, checked to be one per round and partition, each client placed by its
    partition (``declare_partition``) beside its node id, with the server's progress and the
    audit's tables in flwr run's output."""
    records = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    expected = [(r, c) for r in range(1, rounds + 1) for c in (0, 1)]
    assert sorted((r["round"], r["client"]) for r in records) == expected, out[-3000:]
    assert len({r["node_id"] for r in records}) == 2 and all(r["node_id"] > 1 for r in records)
    assert f"round {rounds}/{rounds}" in out and "attacks done" in out, out[-3000:]
    assert "Leakage audit" in out, out[-3000:]
    return records


def _training_images() -> np.ndarray:
    """The ground truth, kept apart from the audit: every training image of the examples."""
    digits = load_digits()
    return ((digits.images[TEST_SIZE:].reshape(-1, 64) / 16.0) - MEAN[0]) / STD[0]


def _certified_are_training_images(run_dir: Path, record: dict[str, Any]) -> np.ndarray:
    """What the attack certifies is a training image, exactly (float32: 1e-4 of the scale);
    the reconstruction's inputs."""
    images = _training_images()
    with np.load(run_dir / record["reconstruction"]) as rec:
        inputs, certified = rec["inputs"], rec["certified"]
    assert int(certified.sum()) == record["certified"]
    for x in inputs[certified]:
        assert np.abs(images - x).max(axis=1).min() < 1e-4 * np.abs(images).max()
    return inputs


@pytest.mark.slow
def test_flwr_run_audits_the_example_app(tmp_path: Path) -> None:
    run_dir, out = _flwr_run(tmp_path, APP, rounds=2)
    # flwr run exits 0 even when the run failed: the records are the evidence.
    records = _records_of_partitions(run_dir, out, rounds=2)
    for r in records:
        # No ground truth in the records: what the attack knows, the judge's metrics None. The
        # batches are drawn unseeded, as Flower's examples draw them: the batch size is read
        # off the float32 spectrum, 8, or another with the attack saying it is unsure.
        assert r["batch_size"] is None and r["psnr_mean"] is None, r
        assert r["batch_size_estimated"] == 8 or r["batch_size_confidence"] < 0.5, r
        assert r["status"] in ("exact", "partial") and (run_dir / r["grid"]).is_file(), r
        inputs = _certified_are_training_images(run_dir, r)
        assert inputs.shape == (r["batch_size_estimated"], 64)
    # The first round's fresh model: batches recovered and certified whole (a batch whose
    # samples the update cannot tell apart is not certified, and its record says why).
    first = [r for r in records if r["round"] == 1]
    assert all(r["certified"] in (0, 8) for r in first), first
    assert all(r["certified"] or "not identifiable" in r["reason"] for r in first), first
    assert "data:image/png" in (run_dir / "report.html").read_text()


@pytest.mark.slow
def test_flwr_run_audits_an_app_written_as_flowers_examples(tmp_path: Path) -> None:
    """F.relu in forward, momentum SGD, one local epoch of shuffled batches of 32 over 40
    images: two steps per round, the update no single gradient, and nothing declared of it."""
    run_dir, out = _flwr_run(tmp_path, MLP_APP, rounds=2)
    records = _records_of_partitions(run_dir, out, rounds=2)
    for r in records:
        assert r["defence"] == "undeclared" and r.get("undeclared_noise") is not True, r
        assert r.get("spectrum_bulk") in (None, "noise or several local steps"), r
        # Whatever the attack made of it, the batch size it read off the spectrum is a field,
        # and nothing it certifies is other than a training image.
        assert r["batch_size_estimated"] is not None, r
        if r["status"] in ("exact", "partial", "failed"):
            _certified_are_training_images(run_dir, r)
        else:
            assert r["status"] == "refused", r
