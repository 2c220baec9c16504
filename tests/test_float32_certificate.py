"""The certificate at float32's round-off: a verified column there can be a mix, so an exact
status also needs every sample's zeros to match (16 of scikit-learn's digits, m=200, verified
16 mixes and were called exact before)."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import nn

from attacks import SpearConfig, reconstruct


def test_float32_digits_are_never_certified_wrong() -> None:
    # One thread: the case that verified 16 mixes (the search's round-off follows the threads).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _check_digits()
    finally:
        torch.set_num_threads(threads)


def _check_digits() -> None:
    digits = load_digits()
    pixels = torch.tensor(digits.images[300:316], dtype=torch.float32).flatten(1) / 16.0
    x = (pixels - 0.3) / 0.4
    y = torch.tensor(digits.target[300:316])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 200), nn.ReLU(), nn.Linear(200, 10))
    nn.functional.cross_entropy(net(x), y).backward()
    layer = net[0]
    assert isinstance(layer, nn.Linear) and layer.weight.grad is not None
    assert layer.bias.grad is not None
    rec = reconstruct(
        layer.weight.grad.double(),
        layer.bias.grad.double(),
        layer.weight.detach().double(),
        layer.bias.detach().double(),
        config=SpearConfig(device="cpu"),
    )
    error = torch.cdist(rec.inputs, x.double()).min(dim=1).values
    certified = rec.certified
    # Whatever the attack found, what it vouches for is right (float32 inputs: 1e-4).
    assert (error[certified] < 1e-4).all(), error[certified]
    if rec.status == "exact":
        assert (error < 1e-4).all(), error
