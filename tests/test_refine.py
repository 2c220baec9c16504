"""Certification accepts true columns and rejects mixes; splitting recovers a mix's columns."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.factor import factorise
from attacks.spearpp.refine import _certify, _null_threshold, canonical_sign, refine_kernel
from attacks.spearpp.zero_rule import ZeroRule
from tests.helpers import observation


def _setup(seed: int) -> tuple[torch.Tensor, torch.Tensor, ZeroRule]:
    view, _, up = observation(16, 200, seed)
    gen = torch.Generator().manual_seed(0)
    fac = factorise(
        view["grad_weight"], batch_size=None, noise_std=None, precision=1e-9, generator=gen
    )
    truth = canonical_sign((fac.left.T @ up.T).T)
    rule = ZeroRule(1e-9, 0.0, 1 / fac.singular_values[:16])
    return fac.left, truth, rule


def _none(b: int) -> torch.Tensor:
    return torch.zeros(0, b, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(3))
def test_true_columns_are_certified(seed: int) -> None:
    left, truth, rule = _setup(seed)
    noisy = truth + 1e-4 * torch.randn(
        truth.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    cands = refine_kernel(left, noisy, rule, False, torch.Generator(), _none(16))
    assert bool(cands.verified.all())
    assert torch.allclose(cands.directions, truth, atol=1e-10)


@pytest.mark.parametrize("seed", range(3))
def test_mixes_are_rejected_and_split(seed: int) -> None:
    left, truth, rule = _setup(seed)
    mixes = truth[:8] * 0.6 + truth[8:] * 0.8  # each a mix of two true columns
    gen = torch.Generator().manual_seed(seed)
    plain = refine_kernel(left, mixes, rule, False, gen, _none(16))
    if plain.verified.any():  # a refined mix may land on a true column, never elsewhere
        hit = (plain.directions[plain.verified] @ truth.T).abs().amax(dim=1)
        assert bool((hit > 1 - 1e-9).all())
    split = refine_kernel(left, mixes, rule, True, gen, _none(16))
    got = split.directions[split.verified]
    assert len(got) > 0
    assert bool(((got @ truth.T).abs().amax(dim=1) > 1 - 1e-9).all())


def test_known_columns_are_not_certified_again() -> None:
    left, truth, rule = _setup(0)
    cands = refine_kernel(left, truth, rule, False, torch.Generator(), truth[:10])
    assert cands.directions.shape[0] == 6


def _certify_on_every_row(
    left: torch.Tensor, v: torch.Tensor, zero: torch.Tensor, entry_tol: torch.Tensor
) -> torch.Tensor:
    """The certificate's definition, brute force: on all of each zero set's rows at once, a
    1-D null space (v's) and no row whose removal grows it (leverage 1)."""
    verdict = []
    for i in range(v.shape[0]):
        rows = left[zero[i]]
        y = rows - (rows @ v[i])[:, None] * v[i]
        eigs, vecs = torch.linalg.eigh(y.T @ y)
        thr = _null_threshold(eigs[None], entry_tol[i : i + 1], zero[i].sum()[None])[0]
        inv = torch.where(eigs[1:] > thr, 1 / eigs[1:], 0.0)
        leverage = ((y @ vecs[:, 1:]).square() * inv).sum(dim=1)
        verdict.append(bool(eigs[1] > thr) and not bool((leverage > 1 - 1e-6).any()))
    return torch.tensor(verdict)


@pytest.mark.parametrize("seed", range(3))
def test_the_certificate_checked_on_a_few_rows_first_matches_its_definition(seed: int) -> None:
    """Columns and mixes of two and of three columns: the verdicts of the certificate, which
    checks each zero set on its first 3B rows before all of them, equal the brute-force ones
    on all rows (every column's zero set here is larger than 3B)."""
    left, truth, rule = _setup(seed)
    pairs = truth[:8] * 0.6 + truth[8:] * 0.8
    triples = truth[:5] + truth[5:10] + truth[10:15]
    v = canonical_sign(torch.cat([truth, pairs, triples]))
    y = v @ left.T
    tol = rule.tolerance(v, y)
    zero = y.abs() <= tol[:, None]
    assert int(zero.sum(dim=1)[:16].min()) > 3 * 16
    one, _ = _certify(left, v, zero, tol)
    reference = _certify_on_every_row(left, v, zero, tol)
    assert torch.equal(one, reference)
    assert bool(one[:16].all()) and not bool(one[16:29].any())
