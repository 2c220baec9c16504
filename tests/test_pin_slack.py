"""Zeros pin a column only as firmly as the gap to the next direction that vanishes on them:
where another column nearly vanishes on a column's zeros, a share of it slips in unseen, and
the certificate must not vouch for the inputs solved with it (float64 over several seeds)."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.solve import PIN_SPREAD_EXACT, pin_slack, pin_spread
from attacks.spearpp.zero_rule import ZeroRule


def _columns(seed: int, leak: float) -> tuple[torch.Tensor, torch.Tensor]:
    """An orthonormal basis L (m x B) and the true directions Q (B x B, rows) of B sparse columns
    L q_i; column 1 is ``leak`` (relative) on column 0's zeros, exactly 0 elsewhere it is off."""
    g = torch.Generator().manual_seed(seed)
    m, b = 60, 5
    cols = torch.randn(m, b, generator=g, dtype=torch.float64)
    cols[torch.rand(m, b, generator=g) < 0.5] = 0.0
    zeros0 = cols[:, 0] == 0
    cols[zeros0, 1] = leak * torch.randn(int(zeros0.sum()), generator=g, dtype=torch.float64)
    left, r = torch.linalg.qr(cols)  # cols = left r: column i is left @ r[:, i]
    return left, r.T


def _inputs(seed: int, q: torch.Tensor, n: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs X (B x n) and the right factor R = Q diag(c) X they give with columns ``q``."""
    g = torch.Generator().manual_seed(seed + 100)
    b = q.shape[0]
    x = torch.rand(b, n, generator=g, dtype=torch.float64)
    scales = torch.rand(b, generator=g, dtype=torch.float64) + 0.1
    return q.T @ (scales[:, None] * x), x


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("share", [1e-9, 1e-6, 1e-3])
def test_the_spread_bounds_what_a_column_moved_by_its_slack_does_to_every_input(
    seed: int, share: float
) -> None:
    g = torch.Generator().manual_seed(seed)
    b, n = 6, 40
    q = torch.nn.functional.normalize(torch.randn(b, b, generator=g, dtype=torch.float64), dim=1)
    right, x = _inputs(seed, q, n)
    scales = torch.linalg.solve(q.T, right).norm(dim=1) / x.norm(dim=1)
    target = q.T @ scales  # the bias gradient in these coordinates
    for i in range(b):
        moved = q.clone()
        moved[i] = q[i] + share * torch.nn.functional.normalize(
            torch.randn(b, generator=g, dtype=torch.float64), dim=0
        )
        solved_scales = torch.linalg.solve(moved.T, target)
        solved = torch.linalg.solve(moved.T, right) / solved_scales[:, None]
        error = (solved - x).norm(dim=1) / x.norm(dim=1)
        slack = torch.zeros(b, dtype=torch.float64)
        slack[i] = share
        bound = pin_spread(q, slack, right, x)
        assert bool((error <= 1.01 * bound + 1e-13).all()), error / bound


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_column_another_nearly_shares_zeros_with_is_loosely_pinned(seed: int) -> None:
    rule = ZeroRule(relative=1e-9, noise_std=0.0, inverse_singular=torch.ones(5))
    left, q = _columns(seed, leak=1e-6)
    right, inputs = _inputs(seed, q)
    exact = pin_slack(q, left, rule)
    # The true columns: firmly pinned, every input within the bound.
    assert bool((pin_spread(q, exact, right, inputs) <= PIN_SPREAD_EXACT).all()), exact
    slipped = q.clone()
    slipped[0] = q[0] + 3e-3 * q[1]  # still within the zero tolerance on column 0's zeros
    slack = pin_slack(slipped, left, rule)
    assert float(slack[0]) > 1e-4 and bool((slack[1:] <= 1e-10).all()), slack
    assert bool((pin_spread(slipped, slack, right, inputs) > PIN_SPREAD_EXACT).any())
    firm_left, firm_q = _columns(seed, leak=1.0)  # column 1 clearly off column 0's zeros
    firm = firm_q.clone()
    firm[0] = firm_q[0] + 3e-3 * firm_q[1]
    assert float(pin_slack(firm, firm_left, rule)[0]) > 1e-4  # a real error is seen either way
