"""The linear algebra behind the fast paths, float64 over several seeds: gathered rows give the
masked products, the block inverse iteration gives the smallest eigenvector, and the row-space
fits by normal equations give the least-squares solution and its residual."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.coupled import _smallest_ritz
from attacks.spearpp.gather import masked_rows
from attacks.spearpp.hidden import InputSpan, held_inputs, hidden_inputs

_SEEDS = [0, 1, 2]


@pytest.mark.parametrize("seed", _SEEDS)
def test_gathered_rows_give_the_masked_products(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    b = torch.randn(50, 4, generator=gen, dtype=torch.float64)
    mask = torch.rand(5, 50, generator=gen) < 0.4
    mask[0] = False  # a point with no rows
    ga, gb = masked_rows(mask, a, b)
    weights = mask.to(a.dtype)[:, :, None]
    torch.testing.assert_close(ga.transpose(1, 2) @ gb, (a * weights).transpose(1, 2) @ b)
    assert ga.shape[1] == int(mask.sum(dim=1).max())


def _psd(gen: torch.Generator, b: int, smallest: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A PSD matrix with one small eigenvalue and the rest in [1, 10], and its eigenvector."""
    q = torch.linalg.qr(torch.randn(b, b, generator=gen, dtype=torch.float64)).Q
    values = torch.cat([torch.tensor([smallest]), 1 + 9 * torch.rand(b - 1, generator=gen)])
    return (q * values.double()) @ q.T, q[:, 0]


@pytest.mark.parametrize("seed", _SEEDS)
def test_block_inverse_iteration_finds_the_smallest_eigenvector(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    pairs = [_psd(gen, 40, small) for small in (1e-10, 1e-3, 0.5)]
    grams = torch.stack([g for g, _ in pairs])
    wanted = torch.stack([v for _, v in pairs])
    starts = torch.randn(3, 40, generator=gen, dtype=torch.float64)
    block = torch.randn(40, 7, generator=gen, dtype=torch.float64)
    found = _smallest_ritz(grams, starts, block)
    off = 1 - (found * wanted).sum(dim=1).abs()
    # Exact where the smallest eigenvalue stands apart (a column's null step); within 1e-4
    # where the next ones are 2 to 20 times it.
    assert float(off[:2].max()) < 1e-12 and float(off[2]) < 1e-4


def test_block_inverse_iteration_falls_back_where_cholesky_fails() -> None:
    gen = torch.Generator().manual_seed(0)
    gram, _ = _psd(gen, 20, 1.0)
    q = torch.linalg.qr(torch.randn(20, 20, generator=gen, dtype=torch.float64)).Q
    indefinite = (q * torch.linspace(-1.0, 5.0, 20, dtype=torch.float64)) @ q.T
    found = _smallest_ritz(
        torch.stack([gram, indefinite]),
        torch.randn(2, 20, generator=gen, dtype=torch.float64),
        torch.randn(20, 7, generator=gen, dtype=torch.float64),
    )
    assert float((found[1] * q[:, 0]).sum().abs()) > 1 - 1e-12


def _least_squares(
    affine: torch.Tensor, active: torch.Tensor, space: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fits by QR: p minimising |(I - S S^T) D (A p + b)| and the relative residual."""
    masked = active.to(affine.dtype)[:, :, None] * affine
    off = masked - space @ (space.T @ masked)
    p = torch.linalg.lstsq(off[..., :-1], -off[..., -1:]).solution
    full = torch.cat([p, torch.ones_like(p[:, :1])], dim=1)
    return p[..., 0], (off @ full).flatten(1).norm(dim=1) / (masked @ full).flatten(1).norm(dim=1)


@pytest.mark.parametrize("seed", _SEEDS)
def test_normal_equation_fits_match_least_squares(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    m, b = 120, 10
    # Columns spanning three decades: the normal equations square that condition.
    scales = torch.logspace(0, -3, b + 1, dtype=torch.float64)
    affine = torch.randn(m, b + 1, generator=gen, dtype=torch.float64) * scales
    space = torch.linalg.qr(torch.randn(m, b, generator=gen, dtype=torch.float64)).Q
    active = torch.rand(6, m, generator=gen) < 0.5
    coords, residuals = hidden_inputs(affine, active, space)
    expected, expected_residuals = _least_squares(affine, active, space)
    torch.testing.assert_close(coords, expected, rtol=1e-9, atol=1e-9 * float(expected.abs().max()))
    torch.testing.assert_close(residuals, expected_residuals, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("seed", _SEEDS)
def test_a_sample_in_the_row_space_is_held_and_a_thin_pattern_is_not(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    m, b, n = 120, 6, 30
    weight = torch.randn(m, n, generator=gen, dtype=torch.float64)
    bias = torch.randn(m, generator=gen, dtype=torch.float64)
    x = torch.randn(b, n, generator=gen, dtype=torch.float64)
    basis = torch.linalg.qr(x.T).Q.T  # b x n, spanning the batch
    affine = torch.cat([weight @ basis.T, bias[:, None]], dim=1)
    hidden = torch.relu(x @ weight.T + bias)
    space = torch.linalg.qr(hidden.T).Q
    active = hidden > 0
    thin = active[:1].clone()
    thin[0, torch.nonzero(thin[0])[b - 1 :, 0]] = False  # fewer active rows than unknowns
    inputs, held = held_inputs(torch.cat([active, thin]), InputSpan(basis, affine), space)
    assert held[:b].all() and not held[b]
    error = (inputs[:b] - x).norm(dim=1) / x.norm(dim=1)
    assert float(error.max()) < 1e-10
    empty, none_held = held_inputs(active[:0], InputSpan(basis, affine), space)
    assert empty.shape == (0, n) and none_held.shape == (0,)
