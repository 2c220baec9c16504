"""Scale and sign from the bias gradient, and the solve for the inputs, against known truth."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.inputs import LayerObservation
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
