"""``fl-sim bench reach``: the judge's view of the sign search, against brute-force checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fl_sim.bench.attack import client_update
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.reach import (
    Truth,
    deflated_rounds,
    estimated_inputs,
    fixed_points,
    landed,
    truth_of,
)
from fl_sim.cli import main
from fl_sim.data.normalize import Normalization
from tests.helpers import SHARED_NPZ, real_images


def _truth(b: int, m: int, seed: int) -> tuple[dict[str, torch.Tensor], Truth]:
    norm = Normalization()
    view, images, _ = client_update(AttackCase("t", b, m), seed, real_images(), norm, torch.float64)
    return view, truth_of(view, images, norm)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_truth_is_in_the_attacks_coordinates(seed: int) -> None:
    """The true columns reproduce the per-sample gradients' zeros, and P Q = I."""
    _, truth = _truth(10, 120, seed)
    left = truth.geom.left
    q = truth.columns
    size = (q @ left.T).abs()
    assert torch.equal(size <= 1e-10 * size.amax(1, keepdim=True), truth.zero.T)
    assert torch.allclose(truth.inputs @ q.T, torch.eye(10, dtype=q.dtype), atol=1e-9)
    assert torch.equal(landed(truth, q), torch.arange(10))
    # A mix of two columns is on none.
    assert int(landed(truth, torch.nn.functional.normalize(q[:1] + q[1:2]))[0]) == -1


def test_exact_inputs_deflate_to_every_column_and_estimates_are_off() -> None:
    """Small m / B: the deflation by exact inputs finds every column; the engine's estimates
    of the inputs are degrees off the truth."""
    _, truth = _truth(12, 80, 0)
    assert int(fixed_points(truth).sum()) >= 6
    gen = torch.Generator().manual_seed(0)
    exact = deflated_rounds(truth, "exact", per_round=16, patience=4, generator=gen)
    assert exact[-1]["found"] == 12
    found = torch.arange(6)
    estimate = estimated_inputs(truth, found)
    cos = torch.nn.functional.cosine_similarity(estimate, truth.inputs[found]).abs()
    assert bool((cos < 1 - 1e-6).all()) and bool((cos > 0.5).all())


def test_an_unknown_kind_of_inputs_is_named() -> None:
    _, truth = _truth(6, 60, 0)
    with pytest.raises(ValueError, match="inputs='true': allowed are estimated, exact"):
        deflated_rounds(truth, "true", per_round=4, patience=1, generator=torch.Generator())


def test_cli_writes_rows_and_summary(tmp_path: Path) -> None:
    real_images()
    out = tmp_path / "reach"
    code = main(
        ["bench", "reach", "--batch-sizes", "8", "--width", "60", "--per-round", "8",
         "--free-iterations", "2", "--data", str(SHARED_NPZ), "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    row = json.loads((out / "rows.jsonl").read_text().splitlines()[0])
    assert row["batch_size"] == 8 and 0 <= row["fixed_points"] <= 8
    assert {"rounds_estimated_free2", "rounds_exact_free4"} <= set(row)
    summary = (out / "summary.md").read_text()
    assert "| 8 | 60 | 0 | 0 |" in summary and summary.count("| 8 | 60 |") == 2


def test_cli_names_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--free-iterations 20: each must be 0 to 14"):
        main(["bench", "reach", "--batch-sizes", "8", "--width", "60", "--free-iterations",
              "20", "--data", str(SHARED_NPZ), "--out", str(tmp_path)])  # fmt: skip
    with pytest.raises(SystemExit, match="--per-round"):
        main(["bench", "reach", "--batch-sizes", "8", "--width", "60", "--per-round", "0",
              "--data", str(SHARED_NPZ), "--out", str(tmp_path)])  # fmt: skip
