"""The audit end to end, and its failure paths: refused, crashed and unfinished attacks."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fl_sim.audit.auditor import Auditor
from fl_sim.audit.context import AuditContext
from fl_sim.audit.job import AttackJob
from fl_sim.audit.log import METRIC_KEYS, AuditLog
from fl_sim.audit.reaudit import reaudit
from fl_sim.audit.runs import AttackRun
from fl_sim.config import AuditSpec, parse_scenario
from fl_sim.data.federated import federated_data
from fl_sim.report import build_report
from fl_sim.run import run_scenario
from fl_sim.rundir import AUDIT, SCENARIO, read_json, write_json
from strategies import InterceptedUpdate, LeftOut

REQUIRED = {"round", "client", "defence", "status", "batch_size", "epsilon", *METRIC_KEYS}

MUST_SHOW: dict[str, Any] = {
    "name": "must-show",
    "rounds": 3,
    "data": {"source": "photos", "samples_per_client": 40, "test_size": 100},
    "model": {"width": 200, "depth": 6},
    "clients": {
        "count": 4,
        "batch_size": 20,
        "lr": 0.1,
        "1": {"defence": "fedavg", "epochs": 3, "mini_batch": 5},
        "2": {"defence": "dp", "clip": 2.0, "noise_multiplier": 1e-4},
        "3": {"defence": "dp", "clip": 2.0, "noise_multiplier": 1.0},
    },
    "audit": {"spearpp": {"starts": 2000, "steps": 1000, "max_passes": 10, "time_budget_s": 8.0}},
}


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / AUDIT).read_text().splitlines()]


def test_undefended_client_comes_back_exactly_every_round(tmp_path: Path) -> None:
    run_dir = run_scenario(parse_scenario(MUST_SHOW), MUST_SHOW, tmp_path / "run")
    records = _records(run_dir)
    assert sorted((r["round"], r["client"]) for r in records) == [
        (r, c) for r in (1, 2, 3) for c in range(4)
    ]
    assert all(set(r) >= REQUIRED for r in records)
    assert all(len(r["samples"]) == r["batch_size"] == 20 for r in records)  # per-sample scores
    undefended = [r for r in records if r["client"] == 0]
    assert all(r["status"] == "exact" and r["share_exact"] == 1.0 for r in undefended)
    assert all(r["psnr_min"] >= 100 for r in undefended)
    assert all(r["certified"] == r["columns_verified"] == 20 for r in undefended)
    # The attack never vouches for more than the judge finds exact.
    assert all(r["share_exact"] >= r["share_certified"] for r in records)
    # One DP step: the next layer's gradient fixes each sample's scale under the noise; one
    # FedSGD step: it is given too (it fixes inputs the first layer may leave open); FedAvg's
    # several steps: not.
    weak_dp = [r for r in records if r["client"] == 2]
    assert all("next_layer" in r["knowledge"] for r in weak_dp)
    assert all(r["share_near_exact"] >= 0.9 for r in weak_dp)
    assert all("next_layer" in r["knowledge"] for r in undefended)
    assert not any("next_layer" in r["knowledge"] for r in records if r["client"] == 1)
    strong_dp = [r for r in records if r["client"] == 3]
    assert all(r["share_near_exact"] == 0.0 for r in strong_dp)
    assert all(r["epsilon"] > 0 for r in strong_dp)
    report = (run_dir / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 4 + 12
    assert "exact 3" in report  # the summary table's status count for client 0


# 99 s of the default run's 22 min: run with -m slow.
@pytest.mark.slow
def test_audit_does_not_change_the_global_model(tmp_path: Path) -> None:
    raw: dict[str, Any] = {
        "rounds": 2,
        "data": {"source": "photos", "samples_per_client": 20, "test_size": 40},
        "model": {"width": 24, "depth": 3},
        "clients": {"count": 2, "batch_size": 8, "1": {"defence": "fedavg", "mini_batch": 4}},
        "audit": {"spearpp": {"starts": 100, "steps": 100, "max_passes": 1}},
    }
    on = run_scenario(parse_scenario(raw), raw, tmp_path / "on")
    off_raw = {**raw, "audit": {"enabled": False}}
    off = run_scenario(parse_scenario(off_raw), off_raw, tmp_path / "off")
    a, b = torch.load(on / "global_model.pt"), torch.load(off / "global_model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len(_records(on)) == 4 and not (off / AUDIT).exists()


def _update(server_round: int, client: int, m: int = 20, n: int = 3072) -> InterceptedUpdate:
    rng = np.random.default_rng(client)
    w = rng.standard_normal((m, n))
    return InterceptedUpdate(
        server_round=server_round,
        node_id=100 + client,
        declared={"partition-id": client, "defence": "fedsgd", "lr": 0.1, "steps": 1},
        sent_weight=w,
        sent_bias=np.zeros(m),
        weight=w - 0.01 * rng.standard_normal((m, n)),
        bias=rng.standard_normal(m),
        audit={"sample-ids": [0, 1, 2]},
    )


class _BrokenJobs(Auditor):
    """An auditor whose jobs crash inside the attack (a batch size that is not a number)."""

    def _job(
        self, update: InterceptedUpdate, base: Any, run: AttackRun
    ) -> tuple[AttackJob, dict[str, str]]:
        job, knowledge = super()._job(update, base, run)
        return replace(job, view=replace(job.view, batch_size="three")), knowledge  # type: ignore[arg-type]


def _data() -> Any:
    scenario = parse_scenario(
        {
            "data": {"source": "photos", "samples_per_client": 10, "test_size": 10},
            "clients": {"count": 1, "batch_size": 3},
        }
    )
    return federated_data(scenario.data, 1, 0)


def test_refused_crashed_and_unfinished_attacks_are_recorded(tmp_path: Path) -> None:
    auditor = _BrokenJobs(AuditContext(AuditSpec(wait_s=30), tmp_path, 0, _data()))
    auditor(_update(1, 0))  # crashes in the worker
    bad = replace(_update(1, 1), problem="reply lacks arrays ['1.weight']")
    auditor(bad)  # rejected at once, never attacked
    assert any(r["status"] == "rejected" for r in _records(tmp_path))  # written before finish()
    auditor.finish()
    slow = Auditor(
        AuditContext(
            AuditSpec(wait_s=0.01, spearpp={"starts": 5000, "steps": 5000, "max_passes": 8}),
            tmp_path,
            0,
            _data(),
        )
    )
    started = time.monotonic()
    slow(_update(2, 0, m=400))  # a full-rank 400 x 3072 update: refused quickly, or slow
    slow.finish()
    assert time.monotonic() - started < 60
    records = {(r["round"], r["client"]): r for r in _records(tmp_path)}
    assert records[(1, 0)]["status"] == "error" and "TypeError" in records[(1, 0)]["reason"]
    assert records[(1, 1)]["status"] == "rejected"
    assert records[(2, 0)]["status"] in ("timeout", "refused")
    assert all(set(r) >= REQUIRED for r in records.values())
    build_report_dir = tmp_path
    (build_report_dir / "rounds.jsonl").write_text("")
    assert build_report(build_report_dir).is_file()


def test_interrupted_audit_resumes_from_stored_updates(tmp_path: Path) -> None:
    raw: dict[str, Any] = {
        "rounds": 2,
        "data": {"source": "photos", "samples_per_client": 20, "test_size": 40},
        "model": {"width": 60, "depth": 3},
        "clients": {"count": 2, "batch_size": 6},
        "audit": {"spearpp": {"starts": 500, "steps": 500, "max_passes": 2}, "keep_updates": True},
    }
    run_dir = run_scenario(parse_scenario(raw), raw, tmp_path / "run")
    complete = _records(run_dir)
    assert len(complete) == 4 and len(list((run_dir / "updates").glob("*.npz"))) == 4
    # An interruption after the first two records: the rest are lost, those two kept.
    lines = (run_dir / AUDIT).read_text().splitlines(keepends=True)
    (run_dir / AUDIT).write_text("".join(lines[:2]))
    assert reaudit(run_dir) == 2
    resumed = _records(run_dir)
    assert sorted((r["round"], r["client"]) for r in resumed) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    by_key = {(r["round"], r["client"]): r["psnr_mean"] for r in complete}
    assert all(r["psnr_mean"] == by_key[(r["round"], r["client"])] for r in resumed)
    # Attacks cut short (interrupted, timed out) are redone, their records replaced.
    cut = [json.loads(x) for x in (run_dir / AUDIT).read_text().splitlines()]
    cut[1] |= {"status": "interrupted", "psnr_mean": None}
    cut[3] |= {"status": "timeout", "psnr_mean": None}
    (run_dir / AUDIT).write_text("".join(json.dumps(r) + "\n" for r in cut))
    assert reaudit(run_dir) == 2
    redone = _records(run_dir)
    assert len(redone) == 4 and all(r["psnr_mean"] is not None for r in redone)
    assert all(r["psnr_mean"] == by_key[(r["round"], r["client"])] for r in redone)
    # A run stored before each attack had its table ([audit] starts, ...) resumes as well.
    stored = read_json(run_dir / SCENARIO)
    stored["resolved"]["audit"] = {"starts": 500, "steps": 500, "max_passes": 2,
                                   "keep_updates": True}  # fmt: skip
    write_json(run_dir / SCENARIO, stored)
    assert reaudit(run_dir, redo=True) == 4
    assert len(_records(run_dir)) == 4 and len(list(run_dir.glob("audit-*.jsonl"))) == 1


def test_left_out_replies_and_interrupted_attacks_are_recorded(tmp_path: Path) -> None:
    spec = AuditSpec(wait_s=600, spearpp={"starts": 5000, "steps": 5000, "max_passes": 8})
    auditor = Auditor(AuditContext(spec, tmp_path, 0, _data()))
    declared = {"partition-id": 3, "defence": "dp", "epsilon": 1.5, "status": "diverged"}
    auditor.left_out(
        LeftOut(2, 103, 3, "diverged", "training loss is nan", declared, {"sample-ids": [4, 5]})
    )
    auditor.left_out(LeftOut(2, 108, None, "client-error", "the ClientApp raised"))
    auditor(_update(2, 0, m=400))  # an attack that cannot be done before the interruption
    started = time.monotonic()
    auditor.finish(interrupted=True)  # no waiting for it
    assert time.monotonic() - started < 20
    records = {(r["round"], r["client"]): r for r in _records(tmp_path)}
    diverged = records[(2, 3)]
    assert (diverged["status"], diverged["reason"]) == ("diverged", "training loss is nan")
    assert diverged["attack"] is None and diverged["batch_size"] == 2
    assert (diverged["defence"], diverged["epsilon"]) == ("dp", 1.5)
    assert records[(2, 108)]["status"] == "client-error"  # no client known: its node id
    assert records[(2, 0)]["status"] == "interrupted"
    assert all(set(r) >= REQUIRED for r in records.values())
    # Without keep_updates, the update of the attack cut short stays for a resumed audit.
    assert [p.name for p in (tmp_path / "updates").glob("*.npz")] == ["r002-c000.npz"]
    assert (2, 0, "spearpp") not in AuditLog(tmp_path).done()


def test_noise_not_told_reaches_the_attack_as_nothing(tmp_path: Path) -> None:
    """``knows_noise = false``: the attack is given no noise level at all (neither the declared
    DP noise nor the server's own rounding estimate) and fits it to the spectrum; records then
    carry what it inferred."""
    dp = replace(
        _update(1, 0),
        declared={"partition-id": 0, "defence": "dp", "lr": 0.1, "steps": 1, "noise-std": 1e-5},
        weight=(_update(1, 0).weight).astype(np.float32),  # float32 weights: rounding noise
    )
    views = {}
    for knows in (True, False):
        auditor = Auditor(
            AuditContext(AuditSpec(knows_noise=knows), tmp_path / str(knows), 0, _data())
        )
        base = auditor._base(dp)
        job, knowledge = auditor._job(dp, base, auditor.runs_for(1, 0)[0])
        views[knows] = (job.view.noise_std, knowledge["noise"])
        auditor.finish()
    assert views[True][0] is not None and views[True][0] > 1e-5
    assert views[True][1] == "declared + rounding"
    assert views[False] == (None, "not told: estimated from the gradient's spectrum")


@pytest.mark.slow
def test_dp_client_audited_without_its_noise_level(tmp_path: Path) -> None:
    """``knows_noise = false``: the one-step DP client (sigma=1e-4) is reconstructed from the
    noise the spectrum shows (it used to be refused), and its record says what was inferred."""
    raw: dict[str, Any] = {
        "rounds": 1,
        "data": {"source": "photos", "samples_per_client": 20, "test_size": 20},
        "model": {"width": 200, "depth": 6},
        "clients": {
            "count": 2,
            "batch_size": 20,
            "lr": 0.1,
            "1": {"defence": "dp", "clip": 2.0, "noise_multiplier": 1e-4},
        },
        "audit": {"knows_noise": False, "spearpp": {"max_passes": 4, "time_budget_s": 8.0}},
    }
    run_dir = run_scenario(parse_scenario(raw), raw, tmp_path / "run")
    records = {r["client"]: r for r in _records(run_dir)}
    dp, plain = records[1], records[0]
    assert dp["knowledge"]["noise"] == "not told: estimated from the gradient's spectrum"
    assert dp["batch_size_estimated"] == 20 and dp["batch_size_method"] == "noise-bulk"
    assert dp["undeclared_noise"] and dp["batch_size_confidence"] == 1.0
    true_std = float(dp["declared"]["noise-std"])
    assert abs(dp["noise_std_estimated"] / true_std - 1) < 0.05
    assert dp["share_near_exact"] >= 0.9
    assert plain["status"] == "exact" and not plain["undeclared_noise"]
    assert plain["noise_std_estimated"] is None
