"""Scale and sign from the bias gradient, and the solve for the inputs, against known truth."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.inputs import LayerObservation, NextLayer
from attacks.spearpp.next_noise import next_layer_noise, next_layer_weight
from attacks.spearpp.refine import canonical_sign
from attacks.spearpp.solve import complete_basis, solve_inputs
from attacks.spearpp.zero_rule import ZeroRule


@pytest.mark.parametrize("seed", range(5))
def test_scales_and_signs_come_back(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    b, m, n = 8, 60, 30
    x = torch.randn(b, n, generator=g, dtype=torch.float64)
    w = torch.randn(m, n, generator=g, dtype=torch.float64)
    bias = torch.randn(m, generator=g, dtype=torch.float64)
    up = torch.randn(b, m, generator=g, dtype=torch.float64) * (x @ w.T + bias > 0)
    gw, gb = up.T @ x, up.sum(0)
    u, s, vh = torch.linalg.svd(gw, full_matrices=False)
    left, right = u[:, :b], s[:b, None] * vh[:b]
    # True columns up to scale and sign, shuffled, sign-normalised as the pool keeps them.
    columns = canonical_sign((left.T @ up.T).T)[torch.randperm(b, generator=g)]
    obs = LayerObservation(gw, gb, w, bias, precision=1e-9)
    rule = ZeroRule(1e-9, 0.0, 1 / s[:b])
    sol = solve_inputs(columns, left, right, obs, rule)
    order = torch.cdist(x, sol.inputs).argmin(dim=1)
    assert torch.allclose(sol.inputs[order], x, atol=1e-9)
    assert torch.allclose(sol.matching, torch.ones(b, dtype=torch.float64))


def test_complete_basis_fills_with_spares_then_complement() -> None:
    cols = torch.eye(5, dtype=torch.float64)[:2]
    spare = torch.nn.functional.normalize(torch.ones(1, 5, dtype=torch.float64), dim=1)
    full = complete_basis(cols, spare, 5)
    assert full.shape == (5, 5)
    assert torch.equal(full[:3], torch.cat([cols, spare]))
    assert torch.linalg.matrix_rank(full) == 5


def _two_layers(
    seed: int, noise: float, next_noise: float | None = None
) -> tuple[LayerObservation, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A one-step gradient of ``Linear -> ReLU -> Linear`` on B inputs, every entry of it with
    Gaussian noise of std ``noise`` (the next layer's ``next_noise`` where given): the
    observation (next layer included), the true inputs, and SVD factors and unit columns of the
    noisy first-layer gradient."""
    g = torch.Generator().manual_seed(seed)
    b, n, m, k = 8, 40, 60, 60
    f64 = torch.float64
    x = torch.randn(b, n, generator=g, dtype=f64)
    w1 = torch.randn(m, n, generator=g, dtype=f64) / n**0.5
    b1 = 0.1 * torch.randn(m, generator=g, dtype=f64)
    w2 = torch.randn(k, m, generator=g, dtype=f64) / (3 * m) ** 0.5  # PyTorch init variance
    z1 = x @ w1.T + b1
    out = torch.randn(b, k, generator=g, dtype=f64)  # each sample's next-layer output gradient
    up = (out @ w2) * (z1 > 0)  # backpropagated through the ReLU: this layer's columns

    def noisy(t: torch.Tensor, std: float = noise) -> torch.Tensor:
        return t + std * torch.randn(t.shape, generator=g, dtype=f64)

    gw, gb = noisy(up.T @ x), noisy(up.sum(0))
    second = noise if next_noise is None else next_noise
    nxt = NextLayer(noisy(out.T @ torch.relu(z1), second), noisy(out.sum(0), second))
    u, s, vh = torch.linalg.svd(gw, full_matrices=False)
    left, right = u[:, :b], s[:b, None] * vh[:b]
    columns = torch.nn.functional.normalize(left.T @ up.T, dim=0).T
    obs = LayerObservation(gw, gb, w1, b1, precision=1e-9, next_layer=nxt)
    return obs, x, left, right, columns


@pytest.mark.parametrize("seed", range(5))
def test_next_layer_scales_are_exact_without_noise(seed: int) -> None:
    obs, x, left, right, columns = _two_layers(seed, noise=0.0)
    rule = ZeroRule(1e-9, 0.0, torch.ones(len(x), dtype=torch.float64))
    sol = solve_inputs(columns, left, right, obs, rule, next_weight=1.0)
    assert torch.allclose(sol.inputs, x, atol=1e-9)


def test_next_layer_pins_scales_under_noise() -> None:
    """The reason for the refit: over seeds, with every gradient entry equally noisy, the
    scales from both layers' bias gradients err far less than from the first layer's alone."""
    errors: dict[bool, list[torch.Tensor]] = {False: [], True: []}
    for seed in range(8):
        obs, x, left, right, columns = _two_layers(seed, noise=0.05)
        rule = ZeroRule(1e-9, 0.05, torch.ones(len(x), dtype=torch.float64))
        for joint in (False, True):
            rec = solve_inputs(columns, left, right, obs, rule, next_weight=float(joint)).inputs
            scale = (rec * x).sum(1) / x.square().sum(1)  # 1 for a right scale
            errors[joint].append((scale - 1).abs())
    bias_only, joint = (torch.cat(errors[j]).median() for j in (False, True))
    assert joint < 0.5 * bias_only, (float(joint), float(bias_only))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("std", [1e-8, 1e-3])
def test_the_next_layers_noise_is_read_off_its_gradient(seed: int, std: float) -> None:
    obs, x, *_ = _two_layers(seed, noise=0.0, next_noise=std)
    assert obs.next_layer is not None
    assert next_layer_noise(obs.next_layer, len(x)) == pytest.approx(std, rel=0.1)
    assert next_layer_weight(obs.next_layer, len(x), 0.25 * std) == pytest.approx(0.25, rel=0.1)


def test_a_next_layer_without_noise_shows_only_round_off() -> None:
    obs, x, *_ = _two_layers(0, noise=0.0)
    assert obs.next_layer is not None
    assert next_layer_noise(obs.next_layer, len(x)) < 1e-12
    # Narrower than the batch: nothing outside the top B directions to read.
    narrow = NextLayer(obs.next_layer.grad_weight[:8], obs.next_layer.grad_bias[:8])
    assert next_layer_noise(narrow, len(x)) == 0.0
    assert next_layer_weight(narrow, len(x), 1e-3) == 1.0


def test_a_noisier_next_layer_weighs_less() -> None:
    """Round-off of a float32 update sent as a float64 difference grows with each layer's
    weights: with the next layer's noise four times this one's, weighting each layer by its own
    noise errs less than equal weights."""
    errors: dict[str, list[torch.Tensor]] = {"equal": [], "weighted": []}
    for seed in range(8):
        obs, x, left, right, columns = _two_layers(seed, noise=0.01, next_noise=0.04)
        assert obs.next_layer is not None
        rule = ZeroRule(1e-9, 0.01, torch.ones(len(x), dtype=torch.float64))
        weights = {"equal": 1.0, "weighted": next_layer_weight(obs.next_layer, len(x), 0.01)}
        for name, weight in weights.items():
            rec = solve_inputs(columns, left, right, obs, rule, next_weight=weight).inputs
            errors[name].append(((rec * x).sum(1) / x.square().sum(1) - 1).abs())
    equal, weighted = (torch.cat(errors[k]).median() for k in ("equal", "weighted"))
    assert weighted < equal, (float(weighted), float(equal))
