"""Scale and sign from the bias gradient, and the solve for the inputs, against known truth."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.inputs import LayerObservation, NextLayer
from attacks.spearpp.refine import ZeroRule, canonical_sign
from attacks.spearpp.solve import complete_basis, solve_inputs


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
    seed: int, noise: float
) -> tuple[LayerObservation, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A one-step gradient of ``Linear -> ReLU -> Linear`` on B inputs, every entry of it with
    Gaussian noise of std ``noise``: the observation (next layer included), the true inputs,
    and SVD factors and unit columns of the noisy first-layer gradient."""
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

    def noisy(t: torch.Tensor) -> torch.Tensor:
        return t + noise * torch.randn(t.shape, generator=g, dtype=f64)

    gw, gb = noisy(up.T @ x), noisy(up.sum(0))
    nxt = NextLayer(noisy(out.T @ torch.relu(z1)), noisy(out.sum(0)))
    u, s, vh = torch.linalg.svd(gw, full_matrices=False)
    left, right = u[:, :b], s[:b, None] * vh[:b]
    columns = torch.nn.functional.normalize(left.T @ up.T, dim=0).T
    obs = LayerObservation(gw, gb, w1, b1, precision=1e-9, next_layer=nxt)
    return obs, x, left, right, columns


@pytest.mark.parametrize("seed", range(5))
def test_next_layer_scales_are_exact_without_noise(seed: int) -> None:
    obs, x, left, right, columns = _two_layers(seed, noise=0.0)
    rule = ZeroRule(1e-9, 0.0, torch.ones(len(x), dtype=torch.float64))
    sol = solve_inputs(columns, left, right, obs, rule, next_layer=True)
    assert torch.allclose(sol.inputs, x, atol=1e-9)


def test_next_layer_pins_scales_under_noise() -> None:
    """The reason for the refit: over seeds, with every gradient entry equally noisy, the
    scales from both layers' bias gradients err far less than from the first layer's alone."""
    errors: dict[bool, list[torch.Tensor]] = {False: [], True: []}
    for seed in range(8):
        obs, x, left, right, columns = _two_layers(seed, noise=0.05)
        rule = ZeroRule(1e-9, 0.05, torch.ones(len(x), dtype=torch.float64))
        for joint in (False, True):
            rec = solve_inputs(columns, left, right, obs, rule, next_layer=joint).inputs
            scale = (rec * x).sum(1) / x.square().sum(1)  # 1 for a right scale
            errors[joint].append((scale - 1).abs())
    bias_only, joint = (torch.cat(errors[j]).median() for j in (False, True))
    assert joint < 0.5 * bias_only, (float(joint), float(bias_only))
