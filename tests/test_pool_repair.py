"""Evicting a mix from a full pool: the pool's eviction and ban, and the engine's choice of what
to evict (``evict_mismatched``) against the algebra it rests on."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.certify import evict_mismatched
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.refine import Candidates

B = 6


def _verified(directions: torch.Tensor, zeros: list[int]) -> Candidates:
    count = directions.shape[0]
    return Candidates(
        torch.nn.functional.normalize(directions, dim=1),
        torch.tensor(zeros),
        torch.ones(count, dtype=torch.bool),
        torch.zeros(count, dtype=torch.bool),
    )


def _columns(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(B, B, generator=g, dtype=torch.float64), dim=1)


def test_evicted_columns_leave_and_banned_ones_never_return() -> None:
    q = _columns(0)
    pool = ColumnPool(B, torch.device("cpu"), spares=0, same_cosine=1 - 1e-6)
    assert pool.add(_verified(q, [50] * B)) == B
    drop = torch.tensor([False, True, False, True, False, False])
    ban = torch.tensor([False, False, False, True, False, False])
    pool.evict(drop, ban)
    assert len(pool) == B - 2
    assert torch.allclose(pool.columns, q[~drop], atol=1e-15)
    assert pool.add(_verified(q[3:4], [50])) == 0  # banned
    assert bool(pool.near_found(-2 * q[3:4], 0.99).all())  # at any scale and sign
    assert pool.add(_verified(q[1:2], [50])) == 1  # evicted, not banned


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_mix_corrupts_exactly_two_samples_and_is_the_one_banned(seed: int) -> None:
    q = _columns(seed)  # rows: the true columns of Q
    g = torch.Generator().manual_seed(100 + seed)
    right = torch.randn(B, 20, generator=g, dtype=torch.float64)  # R, so that X = Q^-1 R
    truth = torch.linalg.solve(q.T, right)
    j, k = 1, 4
    mixed = q.clone()
    mixed[j] = torch.nn.functional.normalize(q[j] + 0.7 * q[k], dim=0)
    inputs = torch.linalg.solve(mixed.T, right)
    cosine = torch.nn.functional.cosine_similarity(inputs, truth, dim=1).abs()
    # The premise of evict_mismatched: sample j's input stays right (up to scale), sample k's
    # becomes a mix, every other one is untouched.
    assert float(cosine[j]) == pytest.approx(1.0, abs=1e-12)
    assert float(cosine[k]) < 0.999
    assert torch.allclose(inputs[[0, 2, 3, 5]], truth[[0, 2, 3, 5]], atol=1e-10)

    # A mix is zero only where both of its columns are: the fewest zeros of the suspects.
    zeros = [2000, 900, 2100, 1900, 2050, 1950]
    pool = ColumnPool(B, torch.device("cpu"), spares=0, same_cosine=1 - 1e-6)
    assert pool.add(_verified(mixed, zeros)) == B
    mismatched = torch.tensor([False, True, False, False, True, False])
    evict_mismatched(pool, pool.columns, mismatched)
    assert len(pool) == B - 2
    assert pool.add(_verified(mixed[j : j + 1], [900])) == 0  # the mix is banned
    assert pool.add(_verified(q[k : k + 1], [2050])) == 1  # the true column comes back
    assert pool.add(_verified(q[j : j + 1], [2000])) == 1
