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
from strategies.behaviours.base import firing_bias

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
    b: int, width: int, seed: int, depth: int = 6, fire_share: float | None = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """A float64 FedSGD observation of the first layer, the true normalised inputs and
    the true per-sample output gradients (B x m). With ``fire_share`` the first layer's biases
    are those of the ``sparsify`` server: each neuron fires for that share of 200 other images."""
    _, x, y = batch(b, seed)
    torch.manual_seed(seed)
    net = fc_relu_net(width, depth).double()
    _, layer = first_linear(net)
    if fire_share is not None:
        _, public, _ = batch(200, seed + 1000)
        public = public[(torch.cdist(public, x).amin(dim=1) > 0)]  # none of the batch's
        with torch.no_grad():
            bias = firing_bias(layer.weight.numpy(), public.numpy(), fire_share)
            layer.bias.copy_(torch.from_numpy(bias))
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
    b: int, width: int, seed: int, depth: int = 6, fire_share: float | None = None
) -> tuple[SignGeometry, torch.Tensor, torch.Tensor]:
    """The sign search's geometry of a FedSGD batch, its true columns of Q (search
    coordinates: L q_i = the sample's output gradient) and the samples' output gradients."""
    view, _x, out_grads = observation(b, width, seed, depth, fire_share)
    fac = factorise(
        view["grad_weight"],
        batch_size=None,
        noise_std=None,
        precision=1e-15,
        generator=torch.Generator().manual_seed(seed),
    )
    geom = SignGeometry.build(fac.left, fac.right, view["weight"], view["bias"])
    truth: torch.Tensor = torch.linalg.lstsq(geom.left, out_grads.T).solution.T
    return geom, truth, out_grads


def nested_batch(
    seed: int,
    b: int = 12,
    m: int = 150,
    n: int = 60,
    rows_apart: int = 1,
    covers: int = 1,
    spread: float = 0.0,
) -> dict[str, torch.Tensor]:
    """A float64 first-layer observation whose sample 0 is inactive where each of samples
    1 to ``covers`` is, but on ``rows_apart`` rows each: the structure of trained networks,
    where sparse samples are zero on nearly every row. Neurons where sample 0 would be inactive
    and a covering sample active are turned around (weight and bias negated); the bias is small
    next to W x, as in trained networks; the output gradients are random on the active neurons.

    Returns the view (``grad_weight``, ``grad_bias``, ``weight``, ``bias``, and the next
    layer's ``next_grad_weight``, ``next_grad_bias``) with the inputs ``x`` (B x n) and output
    gradients ``out_grads`` (m x B).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, n, generator=g, dtype=torch.float64) - 0.5
    weight = torch.randn(m, n, generator=g, dtype=torch.float64) / n**0.5
    bias = 0.01 * torch.randn(m, generator=g, dtype=torch.float64)
    if spread:
        shared = torch.nn.functional.normalize(
            torch.randn(n, generator=g, dtype=torch.float64), dim=0
        )
        weight += shared
        where = torch.linspace(-spread, spread, b, dtype=torch.float64)
        x += where[torch.randperm(b, generator=g), None] * shared
    pre = x @ weight.T + bias  # B x m
    flip = (pre[0] <= 0) & (pre[1 : covers + 1] > 0).any(dim=0)
    for s in range(1, covers + 1):
        flip[torch.nonzero((pre[0] <= 0) & (pre[s] > 0)).flatten()[:rows_apart]] = False
    weight[flip], bias[flip] = -weight[flip], -bias[flip]
    active = (x @ weight.T + bias > 0).T  # m x B
    out_grads = torch.randn(m, b, generator=g, dtype=torch.float64) * active
    # A next linear layer of 30 outputs: its gradient's row space is the hidden vectors'.
    next_out = torch.randn(30, b, generator=g, dtype=torch.float64)
    return {
        "grad_weight": out_grads @ x,
        "grad_bias": out_grads.sum(dim=1),
        "weight": weight,
        "bias": bias,
        "next_grad_weight": next_out @ torch.relu(x @ weight.T + bias),
        "next_grad_bias": next_out.sum(dim=1),
        "x": x,
        "out_grads": out_grads,
    }


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


def sgd_steps(
    seed: int,
    b: int,
    n: int,
    m: int,
    steps: int = 1,
    shift: float = 0.0,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """A depth-3 network (``fc_relu_net(m, 3)``, float64 unless ``dtype``) trained ``steps``
    SGD steps (lr 0.1) on a Gaussian batch (B x n, ``shift`` added: un-centred inputs): the
    inputs, the first two linear layers' weight and bias as sent, and their
    gradient-equivalents (before - after) / lr, in that order."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = fc_relu_net(m, 3, input_dim=n).to(dtype)
    x = (torch.randn(b, n, generator=gen, dtype=torch.float64) + shift).to(dtype)
    y = torch.randint(0, 10, (b,), generator=gen)
    first, second = net[1], net[3]
    params = (first.weight, first.bias, second.weight, second.bias)
    sent = [p.detach().clone() for p in params]
    lr = 0.1
    for _ in range(steps):
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
    grads = [(before - p.detach()) / lr for before, p in zip(sent, params, strict=True)]
    return x, sent, grads
