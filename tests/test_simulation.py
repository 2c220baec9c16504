"""End to end: 3 clients with different defences, 2 rounds, in Flower's simulation engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fl_sim.config import parse_scenario
from fl_sim.run import run_scenario


# 89 s of the default run's 22 min: run with -m slow.
@pytest.mark.slow
def test_three_defences_two_rounds(tmp_path: Path) -> None:
    raw = {
        "name": "e2e",
        "rounds": 2,
        "data": {"source": "photos", "samples_per_client": 30, "test_size": 60},
        "model": {"width": 32, "depth": 3},
        "clients": {
            "count": 3,
            "batch_size": 10,
            "lr": 0.05,
            "1": {"defence": "fedavg", "epochs": 2, "mini_batch": 5},
            "2": {"defence": "dp", "clip": 1.0, "noise_multiplier": 1.0},
        },
    }
    run_dir = run_scenario(parse_scenario(raw), raw, tmp_path / "run")
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    clients = [json.loads(x) for x in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert sorted((c["round"], c["client"]) for c in clients) == [
        (r, c) for r in (1, 2) for c in range(3)
    ]
    dp = [c for c in clients if c["defence"] == "dp"]
    assert dp[0]["epsilon"] < dp[1]["epsilon"]
    assert json.loads((run_dir / "data.json").read_text())["source"] == "photos:scikit-image"
    assert (run_dir / "accuracy.png").stat().st_size > 0
