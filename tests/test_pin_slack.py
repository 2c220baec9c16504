"""Zeros pin a column only as firmly as the gap to the next direction that vanishes on them:
where another column nearly vanishes on a column's zeros, a share of it slips in unseen, and
the certificate must not vouch for the inputs solved with it (float64 over several seeds)."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.refine import ZeroRule
from attacks.spearpp.solve import PIN_SLACK_EXACT, pin_slack


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


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_column_another_nearly_shares_zeros_with_is_loosely_pinned(seed: int) -> None:
    rule = ZeroRule(relative=1e-9, noise_std=0.0, inverse_singular=torch.ones(5))
    left, q = _columns(seed, leak=1e-6)
    exact = pin_slack(q, left, rule)
    assert bool((exact <= PIN_SLACK_EXACT).all()), exact  # the true columns: firmly pinned
    slipped = q.clone()
    slipped[0] = q[0] + 3e-3 * q[1]  # still within the zero tolerance on column 0's zeros
    slack = pin_slack(slipped, left, rule)
    assert float(slack[0]) > 1e-4 and bool((slack[1:] <= PIN_SLACK_EXACT).all()), slack
    firm_left, firm_q = _columns(seed, leak=1.0)  # column 1 clearly off column 0's zeros
    firm = firm_q.clone()
    firm[0] = firm_q[0] + 3e-3 * firm_q[1]
    assert float(pin_slack(firm, firm_left, rule)[0]) > 1e-4  # a real error is seen either way
