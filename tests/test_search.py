"""Surrogate gradients against autograd, and the compacting optimiser against a plain run."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.config import SpearConfig
from attacks.spearpp.search import (
    STEPPERS,
    random_starts,
    run_search,
)
from attacks.spearpp.surrogates import SURROGATES, surrogate_grad

_LOSSES = {
    "l1": lambda y, mu: y.abs().sum(),
    "logcosh": lambda y, mu: (mu * torch.log(torch.cosh(y / mu))).sum(),
    "l4": lambda y, mu: -y.pow(4).sum(),
}


@pytest.mark.parametrize("name", sorted(SURROGATES))
@pytest.mark.parametrize("seed", range(3))
def test_surrogate_gradients_match_autograd(name: str, seed: int) -> None:
    mu = 0.02 / 50**0.5
    y = mu * torch.randn(7, 50, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    y.requires_grad_(True)
    _LOSSES[name](y, mu).backward()
    assert y.grad is not None
    assert torch.allclose(surrogate_grad(name, 50, 0.02)(y.detach()), y.grad, atol=1e-12)


@pytest.mark.parametrize("optimiser", sorted(STEPPERS))
@pytest.mark.parametrize("seed", range(3))
def test_dropping_points_leaves_the_others_untouched(optimiser: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    left, _ = torch.linalg.qr(torch.randn(80, 6, generator=g, dtype=torch.float64))
    starts = random_starts(10, 6, g)
    cfg = SpearConfig(optimiser=optimiser, steps=40, harvest_every=10, search_dtype="float64")
    keep_all = run_search(left, starts, cfg, lambda p: torch.ones(len(p), dtype=torch.bool))
    calls = []

    def drop_odd_once(p: torch.Tensor) -> torch.Tensor:
        calls.append(len(p))
        mask = torch.ones(len(p), dtype=torch.bool)
        if len(calls) == 1:
            mask[1::2] = False
        return mask

    compacted = run_search(left, starts, cfg, drop_odd_once)
    assert calls == [10, 5, 5]
    assert torch.allclose(compacted, keep_all[0::2], atol=1e-14)
    assert torch.allclose(compacted.norm(dim=1), torch.ones(5, dtype=torch.float64))
