"""End to end on tabular medical records: a federation on the breast-cancer set, 2 rounds, and
SPEAR++ recovering the undefended clients' records exactly, with the report built for them."""

from __future__ import annotations

import json
from pathlib import Path

from fl_sim.config import parse_scenario
from fl_sim.run import run_scenario


def test_spearpp_recovers_breast_cancer_records_exactly(tmp_path: Path) -> None:
    raw = {
        "name": "tabular",
        "rounds": 2,
        "data": {"source": "breast_cancer", "samples_per_client": 60, "test_size": 100},
        # B = 16 < min(m, n) = 30: the batch is identifiable from the 200 x 30 gradient.
        "model": {"width": 200, "depth": 6},
        "clients": {"count": 2, "batch_size": 16, "lr": 0.5},
        "audit": {"spearpp": {"time_budget_s": 8.0, "max_passes": 10}},
    }
    run_dir = run_scenario(parse_scenario(raw), raw, tmp_path / "run")
    data = json.loads((run_dir / "data.json").read_text())
    assert data["source"] == "breast_cancer:scikit-learn"
    assert data["input_shape"] == [30] and data["num_classes"] == 2
    records = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert sorted((r["round"], r["client"]) for r in records) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for r in records:
        assert r["status"] == "exact" and r["share_exact"] == 1.0, r
        assert r["batch_size_estimated"] == 16 and r["ssim_mean"] is None
        assert (run_dir / r["grid"]).stat().st_size > 0  # the batch's heat-map
    report = (run_dir / "report.html").read_text()
    assert "(30 features, 2 classes)" in report
    assert report.count("<img") >= len(records)
