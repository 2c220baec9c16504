"""The attack told nothing of the noise: DP-SGD updates and float32 updates as float64 arrays,
on real CIFAR-10 images."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from attacks import Reconstruction, SpearConfig, reconstruct
from fl_sim.audit.metrics import NEAR_EXACT_DB, match_and_score
from fl_sim.bench.attack import client_update
from fl_sim.bench.cases import NOISE_BLIND, PAPER, AttackCase
from fl_sim.data.normalize import Normalization
from tests.helpers import real_images


def _attack(
    view: dict[str, torch.Tensor], noise_std: float | None, seed: int, arrays: bool = False
) -> tuple[Reconstruction, dict[str, Any]]:
    args = {k: v.numpy() if arrays else v for k, v in view.items()}
    nxt = (args["next_grad_weight"], args["next_grad_bias"]) if "next_grad_weight" in args else None
    rec = reconstruct(
        args["grad_weight"],
        args["grad_bias"],
        args["weight"],
        args["bias"],
        noise_std=noise_std,
        next_layer=nxt,
        config=SpearConfig(seed=seed),
    )
    return rec, rec.summary()


def test_dp_noise_not_told_is_fitted_and_reported() -> None:
    """DP-SGD C=2, sigma=1e-4, B=20, m=200, the noise level not told: it is read off the
    spectrum's bulk (within 1%), the batch size with it, and the batch comes back as when told."""
    data, norm = real_images(), Normalization()
    case = PAPER[10]
    near = 0
    for seed in (0, 1):
        view, images, noise_std = client_update(case, seed, data, norm, torch.float64)
        rec, summary = _attack(view, None, seed)
        told, _ = _attack(view, noise_std, seed)
        assert (rec.batch_size, rec.batch_size_method) == (20, "noise-bulk")
        assert rec.batch_size_confidence == 1.0
        assert rec.noise_std_estimated == pytest.approx(noise_std, rel=0.01)
        assert rec.undeclared_noise and rec.noise_declared is None
        assert summary["undeclared_noise"] and "undeclared noise" in str(summary["noise_note"])
        assert not told.undeclared_noise and told.noise_std_used == noise_std
        score = match_and_score(norm.undo(rec.inputs.reshape(-1, 3, 32, 32)), images)
        near += int((score.psnr >= NEAR_EXACT_DB).sum())
        told_score = match_and_score(norm.undo(told.inputs.reshape(-1, 3, 32, 32)), images)
        assert np.allclose(score.psnr, told_score.psnr, atol=0.5)
    assert near >= 0.95 * 2 * case.batch_size


def test_float32_update_as_float64_arrays_is_exact() -> None:
    """A float32 FedSGD update handed over as float64 numpy arrays comes back as it does from
    float32 tensors (it used to fail at about 10 dB): float32 values are recognised, and the
    round-off of the float32 weights (over lr) is fitted as a noise bulk."""
    data, norm = real_images(), Normalization()
    base = AttackCase("f32", 20, 200, dtype="float32")
    for seed in (0, 1):
        psnrs = []
        for arrays in ("tensors", "float64", "float64-diff"):
            case = AttackCase("f32", 20, 200, dtype="float32", arrays=arrays)
            view, images, _ = client_update(case, seed, data, norm, torch.float32)
            if arrays != "tensors":
                assert all(v.dtype == torch.float64 for v in view.values())
            rec, summary = _attack(view, None, seed, arrays=arrays != "tensors")
            assert rec.batch_size == base.batch_size
            pixels = norm.undo(rec.inputs.reshape(-1, 3, 32, 32))
            score = match_and_score(pixels, images.double())
            assert (score.psnr >= NEAR_EXACT_DB).all() and score.psnr.min() > 80
            psnrs.append(score.psnr)
            expected = {
                "tensors": "float32 dtype",
                "float64": "float32 values in a float64 array",
                "float64-diff": "float64 dtype",
            }[arrays]
            assert summary["settings"]["precision_from"] == expected
        assert np.allclose(psnrs[0], psnrs[1]) and np.allclose(psnrs[0], psnrs[2], atol=0.5)


def test_noise_blind_preset_has_the_must_show_rows() -> None:
    names = [c.name for c in NOISE_BLIND]
    assert "DP C=2 sigma=1e-4 B=20 m=200 [noise not told]" in names
    assert "DP C=2 sigma=1e-6 B=150 m=4000 [noise not told]" in names
    assert not next(c for c in NOISE_BLIND if "1e-6" in c.name).knows_noise
    assert any(c.arrays == "float64" and c.dtype == "float32" for c in NOISE_BLIND)
    with pytest.raises(ValueError, match="arrays="):
        AttackCase("bad", 2, 10, arrays="lists")
