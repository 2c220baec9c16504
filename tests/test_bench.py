"""The attack benchmark writes its rows as it goes and a summary at the end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attacks import SpearConfig
from clients import training_settings
from fl_sim.audit.metrics import NEAR_EXACT_DB, psnr
from fl_sim.bench.attack import client_update, near_exact_at_true_scale, run_bench, scale_bound
from fl_sim.bench.cases import AttackCase
from fl_sim.cli import main
from fl_sim.data.normalize import Normalization
from tests.helpers import real_images


def test_bench_writes_rows_and_summary(tmp_path: Path) -> None:
    cases = [
        AttackCase("tiny", 6, 80, attack=SpearConfig(starts=300, steps=400), seeds=(0, 1)),
        AttackCase(
            "tiny fedavg",
            6,
            80,
            training=training_settings("fedavg", lr=0.01, epochs=2, mini_batch=3),
            attack=SpearConfig(starts=300, steps=400),
        ),
    ]
    summaries = run_bench(cases, real_images(), tmp_path, command="test")
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["case"] for r in rows] == ["tiny", "tiny", "tiny fedavg"]
    assert summaries[0]["share_exact_samples"] == 1.0
    assert rows[0]["attack"]["status"] == "exact" and rows[0]["psnr_min"] >= 100
    table = (tmp_path / "summary.md").read_text()
    assert "| tiny | 2 |" in table and "Command: `test`" in table
    assert json.loads((tmp_path / "summary.json").read_text())["cases"][1]["case"] == "tiny fedavg"


@pytest.mark.parametrize("seed", [0, 1])
def test_true_scale_tells_scale_from_pixels(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(4, 3, 32, 32, generator=gen, dtype=torch.float64)
    norm = Normalization()
    truth = norm.apply(images)
    order = np.array([2, 0, 3, 1])  # true sample i came back as reconstruction order[i]
    back = torch.empty_like(truth)
    back[torch.from_numpy(order)] = truth
    # Rescaled: only the scale is wrong. Noisy: the pixels are.
    assert near_exact_at_true_scale(back * 1.3, images, order, norm) == 1.0
    noisy = back + 0.5 * torch.randn(back.shape, generator=gen, dtype=torch.float64)
    assert near_exact_at_true_scale(noisy, images, order, norm) == 0.0
    unmatched = order.copy()
    unmatched[0] = -1
    assert near_exact_at_true_scale(back, images, unmatched, norm) == 0.75


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scale_bound_matches_monte_carlo_least_squares(seed: int) -> None:
    """The closed-form bound against brute force: exact columns, noisy bias gradients drawn
    many times, each sample's scale fitted by least squares, PSNR counted."""
    gen = torch.Generator().manual_seed(seed)
    norm = Normalization()
    images = torch.rand(4, 3, 32, 32, generator=gen, dtype=torch.float64)
    inputs = norm.apply(images).flatten(1)
    columns = torch.randn(30, 4, generator=gen, dtype=torch.float64)
    columns[:, 1] = columns[:, 0] + 0.3 * columns[:, 1]  # two similar samples: worse scales
    noise = 0.08
    bound = scale_bound(columns @ inputs, images, norm, noise)
    trials = 1500
    bias = columns.sum(1) + noise * torch.randn(trials, 30, generator=gen, dtype=torch.float64)
    scales = torch.linalg.lstsq(columns, bias.T).solution.T  # trials x B, truth 1
    rec = inputs[None] / scales[..., None]
    pixels = norm.undo(rec.reshape(-1, 3, 32, 32))
    hits = psnr(pixels, images.repeat(trials, 1, 1, 1)) >= NEAR_EXACT_DB
    assert 0.2 < bound < 0.95  # a regime where the test can tell
    assert float(hits.double().mean()) == pytest.approx(bound, abs=0.03)


def test_cli_names_missing_data(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="CIFAR-10 not found"):
        main(["-q", "bench", "attack", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path)])


def test_cli_custom_case(tmp_path: Path) -> None:
    real_images()
    from tests.helpers import SHARED_NPZ

    main(
        [
            "-q",
            "bench",
            "attack",
            "--data",
            str(SHARED_NPZ),
            "--out",
            str(tmp_path),
            "--batch-size",
            "5",
            "--width",
            "60",
            "--depth",
            "3",
            "--defence",
            "fedavg",
            "--epochs",
            "2",
            "--mini-batch",
            "5",
            "--starts",
            "200",
            "--steps",
            "300",
            "--seeds",
            "0,1",
            "--svd-reference",
        ]
    )
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == [0, 1]
    assert rows[0]["case"] == "l1 radam fedavg B=5 m=60 depth=3"
    assert rows[0]["defence"]["epochs"] == 2
    # The attack's time against one SVD of the same gradient, timed beside it.
    assert all(r["svd_seconds"] > 0 for r in rows)
    summary = json.loads((tmp_path / "summary.json").read_text())["cases"][0]
    ratios = [r["seconds"] / r["svd_seconds"] for r in rows]
    assert summary["svd_ratio_mean"] == pytest.approx(sum(ratios) / 2)
    assert f"({summary['svd_ratio_mean']:.2f} SVD)" in (tmp_path / "summary.md").read_text()


def test_cli_noise_blind_dp_case(tmp_path: Path) -> None:
    """``--noise-blind``: the DP noise level is kept from the attacker, which fits it; rows and
    the table say so."""
    real_images()
    from tests.helpers import SHARED_NPZ

    args = ["-q", "bench", "attack", "--data", str(SHARED_NPZ), "--out", str(tmp_path)]
    args += ["--batch-size", "10", "--width", "200", "--defence", "dp", "--clip", "2"]
    main([*args, "--sigma", "1e-4", "--noise-blind", "--seeds", "0"])
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert rows[0]["case"].endswith("[noise not told]") and rows[0]["noise_told"] is False
    attack = rows[0]["attack"]
    assert attack["settings"]["declared_noise_std"] is None and attack["undeclared_noise"]
    assert attack["batch_size"] == 10 and abs(rows[0]["noise_estimate_error"]) < 0.05
    assert "not told, fit within" in (tmp_path / "summary.md").read_text()


def test_sweep_finds_limit_and_stops_at_first_miss(tmp_path: Path) -> None:
    from fl_sim.bench.pretrain import Pretraining
    from fl_sim.bench.sweep import AT_INIT, SweepPlan, run_sweep

    data = real_images()
    limits = run_sweep(
        [SweepPlan(100, 4, 4, 12)], data, tmp_path / "ok", seeds=(0,), attack=SpearConfig()
    )
    assert limits == {100: 12}
    hopeless = SpearConfig(search="surrogate", starts=1, steps=1, max_passes=1, deflate=False)
    limits = run_sweep(
        [SweepPlan(60, 8, 4, 16)], data, tmp_path / "miss", seeds=(0, 1), attack=hopeless
    )
    assert limits == {60: None}
    steps = json.loads((tmp_path / "miss" / "sweep.json").read_text())["steps"]
    assert [s["batch_size"] for s in steps] == [8]
    # Seed 0 missed by more than seed 1 could make up: seed 1 was not run.
    assert steps[0]["seeds"] == [0]
    # What bounded it, in the attack's words, per seed that missed.
    assert len(steps[0]["misses"]) == 1 and steps[0]["misses"][0].startswith("seed 0: ")
    missed = (tmp_path / "miss" / "summary.md").read_text()
    assert "What bounds each limit" in missed and "m=60, B=8:" in missed
    assert "What bounds" not in (tmp_path / "ok" / "summary.md").read_text()  # none missed
    assert (tmp_path / "ok" / "limit.png").stat().st_size > 0

    from fl_sim.bench.sweep import combine_sweeps

    # A trained network's sweep at the same width is its own series, beside the first.
    trained = run_sweep(
        [SweepPlan(100, 4, 4, 8)],
        data,
        tmp_path / "trained",
        seeds=(0,),
        attack=SpearConfig(),
        pretrain=Pretraining(steps=20),
    )
    assert trained == {100: 8}
    rows = [json.loads(line) for line in (tmp_path / "trained" / "rows.jsonl").open()]
    assert all(r["pretrain"]["steps"] == 20 for r in rows)

    joined = combine_sweeps(
        [tmp_path / "trained", tmp_path / "miss", tmp_path / "ok"], tmp_path / "both"
    )
    network = "trained 20 SGD steps (lr 0.05)"
    assert joined == {AT_INIT: {60: None, 100: 12}, network: {100: 8}}
    assert list(joined) == [AT_INIT, network]  # initialisation first, whatever the order given
    table = (tmp_path / "both" / "summary.md").read_text()
    assert table.count("Measured ") == 3 and f"{AT_INIT}: m=60: none, m=100: 12" in table
    assert f"{network}: m=100: 8" in table and f"| {network} | 100 | 8 |" in table
    assert (tmp_path / "both" / "limit.png").stat().st_size > 0
    with pytest.raises(ValueError, match=r"m=100 \(at initialisation\) was swept in more"):
        combine_sweeps([tmp_path / "ok", tmp_path / "ok"], tmp_path / "twice")


def test_sweep_plan_is_validated() -> None:
    from fl_sim.bench.sweep import SweepPlan

    with pytest.raises(ValueError, match="need 1 <= start"):
        SweepPlan(100, 50, 10, 20)


def test_lavp_bench_writes_rows_table_and_scatter(tmp_path: Path) -> None:
    from fl_sim.bench.lavp import LavpPlan, run_lavp_bench

    plan = LavpPlan(samples=4, width=16, depth=3, iterations=30, chunk=3, proxy_max_iter=60)
    summary = run_lavp_bench(plan, real_images(), tmp_path, command="test")
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(
        "mse:inversion-l2" in r and "mse:inversion-cosine" in r for r in rows
    )
    assert set(summary["losses"]) == {"l2", "cosine"}
    table = (tmp_path / "summary.md").read_text()
    assert "| l2 | lavp_l2_max |" in table and "|rho| 0.51" in table and "Command: `test`" in table
    assert (tmp_path / "scatter.png").stat().st_size > 0
    with pytest.raises(ValueError, match="Spearman needs at least 3"):
        LavpPlan(samples=2)


def test_an_uncentred_case_feeds_pixels_on_the_unit_range(tmp_path: Path) -> None:
    case = AttackCase(
        "tiny [0, 1]", 4, 60, depth=3, centred=False, attack=SpearConfig(starts=200, steps=200)
    )
    assert case.normalization(Normalization()) == Normalization((0.0,) * 3, (1.0,) * 3)
    view, images, _ = client_update(case, 0, real_images(), Normalization(), torch.float64)
    # The inputs as the model took them are the pixels themselves: dW^T's row space holds them.
    x = images.flatten(1)
    residual = x.T - view["grad_weight"].T @ torch.linalg.lstsq(view["grad_weight"].T, x.T).solution
    assert float(residual.abs().max()) < 1e-8
    (summary,) = run_bench([case], real_images(), tmp_path, command="test")
    row = json.loads((tmp_path / "rows.jsonl").read_text().splitlines()[0])
    assert row["centred"] is False and summary["share_exact_samples"] == 1.0


@pytest.mark.parametrize(("epochs", "given"), [(1, True), (2, False)])
def test_the_next_layer_comes_with_one_step_updates_only(epochs: int, given: bool) -> None:
    """As the audit gives FedSGD's: one step's next-layer gradient is the same batch's."""
    training = training_settings("fedavg", lr=0.05, epochs=epochs, mini_batch=4)
    case = AttackCase("tiny", 4, 60, depth=3, training=training)
    view, _, _ = client_update(case, 0, real_images(), Normalization(), torch.float64)
    assert ("next_grad_weight" in view) is given and ("next_grad_bias" in view) is given
    if given:
        assert view["next_grad_weight"].shape == (60, 60)
