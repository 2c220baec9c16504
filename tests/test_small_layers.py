"""A small first layer (16 inputs, 60 neurons, B = 4, 3 classes), as a user's own Flower app
may have: the attack runs to its end (float64 seed 3 made a null step divide 0 by 0, and a sign
round that found nothing crashed the complement search), and the certificate's known hole."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fl_sim.cli import main


def _update(seed: int, dtype: torch.dtype) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One SGD step (lr 0.5) of a Linear(16, 60) + ReLU + Linear(60, 3) client on 4 inputs
    uniform in [0, 1): the saved update and the inputs."""
    generator = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 60), nn.ReLU(), nn.Linear(60, 3)).to(dtype)
    x = torch.rand(4, 16, generator=generator, dtype=dtype)
    y = torch.randint(0, 3, (4,), generator=generator)
    first = model[0]
    sent = {
        "weight": first.weight.detach().numpy().copy(),
        "bias": first.bias.detach().numpy().copy(),
    }
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    nn.functional.cross_entropy(model(x), y).backward()
    optimiser.step()
    after = {
        "weight_after": first.weight.detach().numpy().copy(),
        "bias_after": first.bias.detach().numpy().copy(),
        "lr": np.array(0.5, dtype=sent["weight"].dtype),
    }
    return sent | after, x.double().numpy()


def _attack(update: dict[str, np.ndarray], tmp_path: Path) -> tuple[np.ndarray, np.ndarray, str]:
    np.savez(tmp_path / "update.npz", **update)
    out = tmp_path / "out"
    assert (
        main(["-q", "attack", str(tmp_path / "update.npz"), "--out", str(out), "--device", "cpu"])
        == 0
    )
    with np.load(out / "reconstruction.npz") as rec:
        inputs, certified = rec["inputs"], rec["certified"]
    return inputs, certified, json.loads((out / "result.json").read_text())["status"]


def _error_to_nearest(rec: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """For each reconstruction, the max abs error to its nearest true input."""
    return np.abs(rec[:, None, :] - truth[None, :, :]).max(axis=2).min(axis=1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_small_layer_is_attacked_to_the_end(seed: int, dtype: torch.dtype, tmp_path: Path) -> None:
    torch.manual_seed(seed)
    update, truth = _update(seed, dtype)
    rec, certified, status = _attack(update, tmp_path)
    assert status in ("exact", "partial", "failed")
    assert rec.shape == truth.shape and certified.shape == (len(truth),)


@pytest.mark.xfail(
    reason="known certificate hole, measured: in a one-hidden-layer network with C classes "
    "any C samples' output gradients are dependent (C - 1 dimensions), so a mix of their "
    "columns cancels wherever they are all active, is sparser than a true column and passes "
    "the certificate (float64 seeds 0, 1 and 3 here: 'exact', 2 to 3 of 4 samples wrong); "
    "a check of each sample's zeros against its input's inactive neurons catches it but also "
    "demotes true multi-step FedAvg columns, whose zeros are taken at later weights",
    strict=False,
)
@pytest.mark.parametrize("seed", [0, 1, 3])
def test_float64_small_layer_certifies_only_right_samples(seed: int, tmp_path: Path) -> None:
    torch.manual_seed(seed)
    update, truth = _update(seed, torch.float64)
    rec, certified, _ = _attack(update, tmp_path)
    assert (_error_to_nearest(rec[certified], truth) < 1e-8).all()
