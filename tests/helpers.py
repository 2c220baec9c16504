"""Shared builders: real CIFAR-10 images from ../shared when present, client gradients, a stand-in
Grid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Message
from flwr.serverapp import Grid

from attacks.spearpp.factor import factorise
from attacks.spearpp.signs import SignGeometry
from fl_sim.data.cifar10 import ImageSet, read_npz
from fl_sim.data.normalize import Normalization
from fl_sim.model import fc_relu_net, first_linear, layer_gradients

SHARED_NPZ = (
    Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cifar10_test_1000.npz"
)


def real_images() -> ImageSet:
    """The 1,000 real CIFAR-10 test images beside the project (tests only, never the product)."""
    if not SHARED_NPZ.is_file():
        pytest.skip(f"{SHARED_NPZ} is not here")
    return read_npz(SHARED_NPZ)


def batch(b: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``b`` real images: pixels on [0, 1] (b x 3 x 32 x 32), normalised flat inputs, labels."""
    data = real_images()
    idx = np.random.default_rng(seed).choice(len(data.labels), b, replace=False)
    pixels = torch.from_numpy(data.images[idx]).permute(0, 3, 1, 2).double() / 255
    return pixels, Normalization().apply(pixels).flatten(1), torch.from_numpy(data.labels[idx])


def observation(
    b: int, width: int, seed: int, depth: int = 6
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """A float64 FedSGD observation of the first layer, the true normalised inputs and
    the true per-sample output gradients (B x m)."""
    _, x, y = batch(b, seed)
    torch.manual_seed(seed)
    net = fc_relu_net(width, depth).double()
    _, layer = first_linear(net)
    z = layer(x)
    z.retain_grad()
    out = net[3:](net[2](z))
    torch.nn.functional.cross_entropy(out, y).backward()
    assert z.grad is not None
    gw, gb = layer_gradients(net, x, y)
    view = {
        "grad_weight": gw,
        "grad_bias": gb,
        "weight": layer.weight.detach(),
        "bias": layer.bias.detach(),
    }
    return view, x, z.grad.detach()


def best_match_error(rec: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per true sample, the max abs error against its nearest reconstruction."""
    d = torch.cdist(x, rec)
    return (rec[d.argmin(dim=1)] - x).abs().amax(dim=1)


def sign_geometry(
    b: int, width: int, seed: int, depth: int = 6
) -> tuple[SignGeometry, torch.Tensor, torch.Tensor]:
    """The sign search's geometry of a FedSGD batch, its true columns of Q (search
    coordinates: L q_i = the sample's output gradient) and the samples' output gradients."""
    view, _x, out_grads = observation(b, width, seed, depth)
    fac = factorise(
        view["grad_weight"],
        batch_size=None,
        noise_std=None,
        precision=1e-15,
        generator=torch.Generator().manual_seed(seed),
    )
    geom = SignGeometry.build(fac.left, fac.right, view["weight"])
    truth: torch.Tensor = torch.linalg.lstsq(geom.left, out_grads.T).solution.T
    return geom, truth, out_grads


class UnusedGrid(Grid):
    """A stand-in Flower ``Grid`` for tests that drive a strategy in-process: the parts of the
    interface a strategy never calls raise."""

    def set_run(self, run: Any) -> None:
        raise NotImplementedError

    @property
    def run(self) -> Any:
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        raise NotImplementedError
