"""Batch size from the gradient's rank: exact products, float32 round-off, DP noise."""

from __future__ import annotations

import math

import pytest
import torch

from attacks.spearpp.factor import factorise


def _gradient(b: int, m: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    up = torch.randn(b, m, generator=g, dtype=torch.float64)
    up = up * (torch.rand(b, m, generator=g) > 0.5)
    return up.T @ torch.randn(b, n, generator=g, dtype=torch.float64)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("b", [1, 7, 40, 130])
def test_float_rank_finds_batch_size(b: int, seed: int) -> None:
    gw = _gradient(b, 300, 500, seed)
    fac = factorise(gw, batch_size=None, noise_std=None, precision=1e-9, generator=_gen())
    assert (fac.batch_size, fac.method) == (b, "float-rank")
    assert torch.allclose(fac.left.T @ fac.left, torch.eye(b, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(fac.left @ fac.right, gw, atol=1e-10 * gw.abs().max())


@pytest.mark.parametrize("seed", range(3))
def test_randomised_factor_matches_full_svd(seed: int) -> None:
    gw = _gradient(25, 400, 600, seed)
    fast = factorise(gw, batch_size=None, noise_std=None, precision=1e-9, generator=_gen())
    s_full = torch.linalg.svdvals(gw)[:25]
    assert torch.allclose(fast.singular_values[:25], s_full, rtol=1e-10)


def test_float32_gradient_uses_its_precision() -> None:
    gw = _gradient(20, 200, 300, 0).float().double()
    fac = factorise(gw, batch_size=None, noise_std=None, precision=1.2e-5, generator=_gen())
    assert fac.batch_size == 20


@pytest.mark.parametrize("seed", range(3))
def test_declared_noise_sets_the_edge(seed: int) -> None:
    m, n, b = 200, 600, 20
    gw = _gradient(b, m, n, seed)
    std = 1e-3 * float(gw.std())
    noisy = gw + std * torch.randn(m, n, generator=torch.Generator().manual_seed(9), dtype=gw.dtype)
    fac = factorise(noisy, batch_size=None, noise_std=std, precision=1e-9, generator=_gen())
    assert (fac.batch_size, fac.method) == (b, "noise-edge")


def test_undeclared_noise_falls_back_to_the_spectral_gap() -> None:
    gw = _gradient(20, 200, 600, 0)
    std = 1e-4 * float(gw.std())
    gen = torch.Generator().manual_seed(9)
    noisy = gw + std * torch.randn(200, 600, generator=gen, dtype=gw.dtype)
    fac = factorise(noisy, batch_size=None, noise_std=None, precision=1e-9, generator=_gen())
    assert (fac.batch_size, fac.method) == (20, "spectral-gap")


def test_declared_batch_size_wins() -> None:
    fac = factorise(
        _gradient(12, 100, 200, 0), batch_size=12, noise_std=None, precision=1e-9, generator=_gen()
    )
    assert (fac.batch_size, fac.method) == (12, "declared")
    assert not math.isnan(float(fac.right.sum()))
