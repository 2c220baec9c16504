"""The audit with the optimisation attack and the proxies: records per attack run, per-sample
proxies, per-round correlations, and the report's forecast section."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_sim import rundir
from fl_sim.audit.auditor import Auditor
from fl_sim.audit.context import AuditContext
from fl_sim.audit.updates import load_update, save_update
from fl_sim.config import AuditSpec, parse_scenario
from fl_sim.data.federated import federated_data
from fl_sim.forecast import PROXIES
from fl_sim.model import fc_relu_net
from fl_sim.report import build_report
from strategies import InterceptedUpdate

LAYER = ("1.weight", "1.bias")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _update(data: Any, net: torch.nn.Module, client: int, whole: bool = True) -> InterceptedUpdate:
    """One FedSGD step of ``client`` on its first three samples, as the server receives it."""
    ids = data.partitions[client][:3]
    sent = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    local = fc_relu_net(16, 3).double()
    local.load_state_dict(net.state_dict())
    x, y = data.tensors(ids)
    torch.optim.SGD(local.parameters(), lr=0.1).zero_grad()
    torch.nn.functional.cross_entropy(local(x.double()), y).backward()
    torch.optim.SGD(local.parameters(), lr=0.1).step()
    received = {k: v.detach().numpy().copy() for k, v in local.state_dict().items()}
    return InterceptedUpdate(
        server_round=1,
        node_id=50 + client,
        declared={"partition-id": client, "defence": "fedsgd", "lr": 0.1, "steps": 1},
        sent_weight=sent[LAYER[0]],
        sent_bias=sent[LAYER[1]],
        weight=received[LAYER[0]],
        bias=received[LAYER[1]],
        audit={"sample-ids": [int(i) for i in ids]},
        sent_arrays=sent if whole else None,
        arrays=received if whole else None,
    )


def test_inversion_and_proxies_are_recorded_per_sample(tmp_path: Path) -> None:
    scenario = parse_scenario(
        {
            "data": {"source": "photos", "samples_per_client": 6, "test_size": 10},
            "clients": {"count": 3, "batch_size": 3},
        }
    )
    data = federated_data(scenario.data, 3, 0)
    torch.manual_seed(0)
    net = fc_relu_net(16, 3).double()
    spec = AuditSpec(
        rounds=(1,),
        attacks=("inversion",),  # SPEAR++ beside it: the table tests in test_forecast.py
        inversion={"losses": ["cosine", "l2"], "iterations": 60, "restarts": 1, "device": "cpu"},
        proxies=True,
        proxy_max_iter=80,
        wait_s=120,
        knows_batch_size=True,
    )
    auditor = Auditor(AuditContext(spec, tmp_path, 0, data, architecture=net, layer=LAYER))
    assert auditor.keeps_whole(1, {"partition-id": 2}) and not auditor.keeps_whole(2, {})
    for client in (0, 1):
        assert auditor.queue(_update(data, net, client)) == 3  # 2 attack runs + proxies
    assert auditor.queue(_update(data, net, 2, whole=False)) == 0  # refused at once
    auditor.finish()
    records = _lines(tmp_path / rundir.AUDIT)
    runs = sorted((r["client"], r["attack"], r.get("loss"), r["status"]) for r in records)
    assert runs == [
        (c, "inversion", loss, "refused" if c == 2 else "approximate")
        for c in (0, 1, 2)
        for loss in ("cosine", "l2")
    ]
    scored = [r for r in records if r["status"] != "refused"]
    assert all(
        len(r["samples"]) == 3 and {"id", "label", "psnr", "mse"} <= set(r["samples"][0])
        for r in scored
    )
    assert all(
        r["knowledge"]["labels"] == "recovered" for r in scored if r["attack"] == "inversion"
    )
    proxies = _lines(tmp_path / rundir.PROXIES)
    assert sorted(p["client"] for p in proxies) == [0, 1, 2]
    refused = next(p for p in proxies if p["client"] == 2)
    assert refused["status"] == "refused"
    done = [p for p in proxies if p["status"] == "done"]
    values = [s[name] for p in done for s in p["samples"] for name in PROXIES]
    assert len(values) == 6 * len(PROXIES) and all(math.isfinite(v) and v > 0 for v in values)
    forecast = _lines(tmp_path / rundir.FORECAST)
    assert {(f["run"], f["round"]) for f in forecast} == {
        (run, r) for run in ("inversion-cosine", "inversion-l2") for r in (1, None)
    }
    assert all(f["samples"] == 6 and set(f["spearman"]) == set(PROXIES) for f in forecast)
    joined = _lines(tmp_path / rundir.FORECAST_SAMPLES)
    assert len(joined) == 6 and all(
        {"mse:inversion-l2", "psnr:inversion-cosine"} <= set(s) for s in joined
    )
    (tmp_path / "rounds.jsonl").write_text("")
    html = build_report(tmp_path).read_text()
    assert "Forecast: vulnerability proxies" in html and "Optimisation attack" in html
    assert (tmp_path / "plots" / "forecast.png").stat().st_size > 0
    assert np.isfinite([r["psnr_mean"] for r in scored]).all()


def test_a_whole_update_is_stored_and_read_back(tmp_path: Path) -> None:
    data = federated_data(
        parse_scenario(
            {
                "data": {"source": "photos", "samples_per_client": 6, "test_size": 10},
                "clients": {"count": 1, "batch_size": 3},
            }
        ).data,
        1,
        0,
    )
    torch.manual_seed(0)
    update = _update(data, fc_relu_net(16, 3).double(), 0)
    save_update(update, tmp_path / "u.npz")
    back = load_update(tmp_path / "u.npz")
    assert back.arrays is not None and back.sent_arrays is not None and update.arrays is not None
    assert (
        set(back.arrays)
        == set(update.arrays)
        == {f"{i}.{p}" for i in (1, 3, 5) for p in ("weight", "bias")}
    )
    assert all(np.array_equal(back.arrays[k], update.arrays[k]) for k in update.arrays)
    assert back.declared == update.declared and np.array_equal(back.weight, update.weight)


def test_every_registered_attack_runs_once_per_variant() -> None:
    from fl_sim.audit.runs import audit_runs

    spec = AuditSpec(attacks=("spearpp", "inversion"), inversion={"losses": ["l2", "cosine"]})
    assert [r.label for r in audit_runs(spec)] == ["spearpp", "inversion-l2", "inversion-cosine"]
