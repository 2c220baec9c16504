"""Flower's SecAgg+ arithmetic as the bench applies it, and the noise the server works out."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from fl_sim.bench.secagg import SecAggPlan, join_runs, secagg_sum
from fl_sim.config.federation import SecAggSpec
from strategies.quantisation import secagg_noise_std


def _clients(k: int, shape: tuple[int, ...], seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        [rng.uniform(-0.05, 0.05, shape), rng.uniform(-0.05, 0.05, shape[:1])] for _ in range(k)
    ]


@pytest.mark.parametrize(("examples", "spec"), [
    ([16, 16, 16, 16], SecAggSpec()),
    ([5, 20, 40], SecAggSpec()),
    ([8, 8], SecAggSpec(max_weight=8.0, quantization_range=2**26)),
])  # fmt: skip
def test_the_sum_is_the_weighted_average_with_the_predicted_quantisation_noise(
    examples: list[int], spec: SecAggSpec
) -> None:
    clients = _clients(len(examples), (300, 200), seed=len(examples))
    np.random.seed(0)
    summed = secagg_sum(clients, examples, spec)
    total = sum(examples)
    # The reference: the plain weighted average, computed directly.
    for got, arrays in zip(summed, zip(*clients, strict=True), strict=True):
        want = sum(n * a for n, a in zip(examples, arrays, strict=True)) / total
        error = got - want
        predicted = secagg_noise_std(
            examples, spec.clipping_range, spec.quantization_range, spec.max_weight
        )
        if error.size > 1000:  # the weight matrix: enough entries for the statistics
            assert abs(error.mean()) < 5 * predicted / np.sqrt(error.size)  # unbiased
            assert error.std() == pytest.approx(predicted, rel=0.05)
        # The weights Flower rounds (q_i / R for n_i / max_weight) leave a bias far below it.
        assert np.abs(error).max() < 8 * predicted


def test_the_noise_grows_with_max_weight_and_falls_with_the_examples() -> None:
    base = secagg_noise_std([16] * 8, 8.0, 2**22, 1000.0)
    assert secagg_noise_std([16] * 8, 8.0, 2**22, 100.0) == pytest.approx(base / 10, rel=1e-3)
    assert secagg_noise_std([32] * 8, 8.0, 2**22, 1000.0) == pytest.approx(base / 2, rel=1e-3)
    with pytest.raises(ValueError, match="nothing was summed"):
        secagg_noise_std([0], 8.0, 2**22, 1000.0)


def test_points_far_beyond_the_limit_are_skipped_with_their_reason() -> None:
    plan = SecAggPlan()
    assert plan.skip_reason(1000, 128) is None
    reason = plan.skip_reason(1000, 256)
    assert reason is not None and "110" in reason
    assert SecAggPlan(skip_factor=None).skip_reason(1000, 4096) is None


def test_joined_runs_keep_each_rows_setting(tmp_path: Path) -> None:
    rows = [
        {"width": 1000, "cohort": 1, "batch_per_client": 4, "samples": 4, "status": "exact",
         "share_exact": 0.0, "share_near_exact": 1.0},
        {"width": 1000, "cohort": 16, "batch_per_client": 64, "samples": 1024,
         "status": "skipped", "reason": "beyond"},
    ]  # fmt: skip
    for name, weight in (("fine", 64.0), ("defaults", 1000.0)):
        plan = asdict(SecAggPlan()) | {"secagg": SecAggSpec(max_weight=weight).model_dump()}
        (tmp_path / name).mkdir()
        (tmp_path / name / "secagg.json").write_text(json.dumps({"plan": plan, "rows": rows}))
    joined = join_runs([tmp_path / "fine", tmp_path / "defaults"], tmp_path / "out")
    assert len(joined) == 4
    settings = {r["run"]: r["setting"] for r in joined}
    assert settings["fine"].startswith("max_weight 64, 2^22 levels")
    assert settings["defaults"].startswith("max_weight 1000, 2^22 levels")
    assert (tmp_path / "out" / "secagg.png").is_file()
    lines = (tmp_path / "out" / "secagg.csv").read_text().splitlines()
    assert lines[0].startswith("run,setting,width") and len(lines) == 5
