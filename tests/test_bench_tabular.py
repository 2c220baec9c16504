"""``fl-sim bench attack`` on tabular records (scikit-learn's breast-cancer set, offline): the
records min-max scaled to [0, 1] or standardised, scored on their [0, 1] scale as pixels are."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_sim.bench.attack import client_update, run_case
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.converge import Convergence
from fl_sim.cli import main
from fl_sim.data.breast_cancer import load_breast_cancer_records
from fl_sim.data.normalize import Normalization


def _records_case(b: int, m: int, centred: bool, depth: int = 6) -> AttackCase:
    return AttackCase("t", b, m, depth=depth, centred=centred, dataset="breast-cancer")


def test_a_min_max_case_feeds_the_records_on_the_unit_range() -> None:
    view, samples, _ = client_update(
        _records_case(12, 80, False, depth=3), 0, None, Normalization(), torch.float64
    )
    records = load_breast_cancer_records()
    idx = np.random.default_rng(0).choice(len(records.labels), 12, replace=False)
    low, high = np.asarray(records.low), np.asarray(records.high)
    assert torch.equal(samples, torch.from_numpy((records.records[idx] - low) / (high - low)))
    # The inputs as the model took them are these records: dW^T's row space holds them.
    gw = view["grad_weight"]
    residual = samples.T - gw.T @ torch.linalg.lstsq(gw.T, samples.T).solution
    assert float(residual.abs().max()) < 1e-8


def test_a_centred_case_standardises_by_the_whole_set() -> None:
    norm = _records_case(10, 50, True).normalization(Normalization())
    records = load_breast_cancer_records()
    low, high = np.asarray(records.low), np.asarray(records.high)
    inputs = norm.apply(torch.from_numpy((records.records - low) / (high - low)))
    assert norm.ndim == 1 and len(norm.mean) == 30
    assert float(inputs.mean(0).abs().max()) < 1e-12
    assert float((inputs.std(0, correction=0) - 1).abs().max()) < 1e-12
    unit = _records_case(10, 50, False).normalization(Normalization())
    assert unit == Normalization((0.0,) * 30, (1.0,) * 30, ndim=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_min_max_records_whose_samples_leave_few_neurons_inactive(seed: int) -> None:
    """B=20, m=256, depth 6: 68 to 73 silent neurons. Seed 0 stopped at 4 of 20 columns on the
    default null-step rows."""
    row = run_case(_records_case(20, 256, False), seed, None, Normalization(), torch.float64)
    assert row["attack"]["status"] == "exact", row["attack"]["reason"]
    assert row["share_exact"] == 1.0 and row["certified_not_exact"] == 0
    assert row["dataset"] == "breast-cancer" and row["ssim_mean"] is None


def test_min_max_records_whose_weak_columns_carry_amplified_round_off() -> None:
    """B=25, m=256, seed 2: s_B / s_1 = 1.2e-4, and the true columns' zeros sit at 1e-9 to
    1.5e-9 of their largest entries, above the float64 floor: counted as active, they kept the
    next layer's fits off those samples (5 of 25 exact before the round-off's norm entered the
    zero rule)."""
    row = run_case(_records_case(25, 256, False), 2, None, Normalization(), torch.float64)
    assert row["attack"]["status"] == "exact", row["attack"]["reason"]
    assert row["share_exact"] == 1.0 and row["certified_not_exact"] == 0


def test_bad_datasets_are_named() -> None:
    with pytest.raises(ValueError, match="dataset='mnist': allowed are images, breast-cancer"):
        AttackCase("t", 4, 50, dataset="mnist")
    with pytest.raises(ValueError, match="converged networks train on the bench's images"):
        AttackCase("t", 4, 50, dataset="breast-cancer", converged=Convergence())


def test_the_tabular_preset_runs_without_images(tmp_path: Path) -> None:
    out = tmp_path / "tab"
    main(["-q", "bench", "attack", "--preset", "tabular", "--only", "standardised B=10 m=256",
          "--seeds", "0", "--out", str(out)])  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["data"] == "breast_cancer:scikit-learn"
    (case,) = summary["cases"]
    assert case["case"] == "breast-cancer standardised B=10 m=256"
    assert case["share_exact_samples"] == 1.0 and case["ssim_mean"] is None
    assert "| breast-cancer standardised B=10 m=256 | 1 |" in (out / "summary.md").read_text()
    with pytest.raises(SystemExit, match="--data is needed, case 'quick l1 RAdam B=20 m=200'"):
        main(["-q", "bench", "attack", "--preset", "quick", "--out", str(tmp_path / "q")])


def test_a_full_rank_batch_is_recorded_as_refused(tmp_path: Path) -> None:
    """30 records of 30 features: the gradient has full rank, so nothing can be separated; the
    bench records that as a result (nothing exact) instead of stopping."""
    main(["-q", "bench", "attack", "--dataset", "breast-cancer", "--batch-size", "30",
          "--width", "100", "--depth", "3", "--out", str(tmp_path)])  # fmt: skip
    (row,) = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert row["case"] == "l1 radam fedsgd B=30 m=100 depth=3 [breast-cancer]"
    assert row["attack"]["reason"].startswith("refused: estimated batch size B_hat=30")
    assert row["share_exact"] == 0.0 and row["attack"]["certified"] == 0
