"""SPEAR++ on a first layer whose biases fire each neuron for a tenth of the samples (the
``sparsify`` server's): true columns stay fixed points of the sign search null-stepping on all
their zeros, and batches are recovered exactly (before the affine fits, the jumps past m - m/8
zeros and the whole zero sets, SPEAR++ found 24 of 64 columns in 60 s at m = 1000, where it
finds all 64 of the honest layer in 5 s)."""

from __future__ import annotations

import pytest
import torch

from attacks import SpearConfig, reconstruct
from attacks.spearpp.rounds import few_zero_rows
from attacks.spearpp.signs import null_step_rows, sign_search
from tests.helpers import best_match_error, observation, sign_geometry

SHARE = 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_true_columns_are_fixed_points(seed: int) -> None:
    geom, truth, out_grads = sign_geometry(32, 600, seed, depth=3, fire_share=SHARE)
    # The layer is as sparse as asked: about a tenth of the neurons fire per sample.
    assert 0.05 < float((out_grads != 0).double().mean()) < 0.15
    truth = torch.nn.functional.normalize(truth, dim=1)
    out = sign_search(geom, truth, None, 10, whole=True)
    # (A sample whose few active neurons another sample shares is null on that one's zeros
    # too: its column is not pinned there, and may leave.)
    stayed = (out @ truth.T).abs().diagonal() > 1 - 1e-9
    assert float(stayed.double().mean()) >= 0.9


def test_sparsified_batches_are_exact_and_every_certified_sample_is_true() -> None:
    # Seed 1 stops at 30 of 32 columns (20 samples certified), on the engine before the
    # median labels of the sign search's first iterations too, on this machine's BLAS; on
    # another it was exact. What the attack vouches for must be true in every seed.
    exact = 0
    for seed in range(3):
        view, x, _ = observation(32, 600, seed, depth=3, fire_share=SHARE)
        # CPU seconds: a wall-clock budget would measure the machine's load.
        config = SpearConfig(
            starts=500, steps=600, seed=seed, time_budget_s=60.0, budget_clock="cpu"
        )
        rec = reconstruct(**view, config=config)
        assert rec.batch_size == 32
        certified = rec.inputs[rec.certified]
        assert certified.shape[0] >= 20
        assert best_match_error(x, certified).max() < 1e-6
        if rec.status == "exact":
            exact += 1
            assert best_match_error(rec.inputs, x).max() < 1e-6
    assert exact >= 2


def test_the_budget_stops_a_round_between_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # A widened round on a sparse layer at m = 4000 once ran 240 s past its budget, which was
    # checked only between rounds: chunks of starts (max_elements) are checked one by one.
    import attacks.spearpp.rounds as rounds
    import attacks.spearpp.stages as stages

    view, _, _ = observation(32, 600, 0, depth=3, fire_share=SHARE)
    chunks: list[int] = []

    def counted(geom: object, starts: torch.Tensor, *args: object, **kwargs: object) -> object:
        chunks.append(starts.shape[0])
        return sign_search(geom, starts, *args, **kwargs)  # type: ignore[arg-type]

    # The clock runs out once the first chunk is searched.
    monkeypatch.setattr(rounds, "sign_search", counted)
    monkeypatch.setattr(stages, "budget_clock", lambda kind: lambda: 1.0 if chunks else 0.0)
    # The first round's null steps use few_zero_rows' rows where it gives any (the layer has
    # silent neurons), else the default: chunks of 2 starts.
    silent = int((~view["grad_weight"].any(dim=1) & (view["grad_bias"] == 0)).sum())
    rows = few_zero_rows(600 - silent, 32, silent) or null_step_rows(600, 32)
    config = SpearConfig(sign_starts=8, max_elements=2 * rows * 32, time_budget_s=0.5)
    rec = reconstruct(**view, config=config)
    assert chunks == [2]
    assert rec.counts["sign_rounds"] == 1 and rec.counts["passes"] == 0
