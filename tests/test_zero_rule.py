"""The zero rule: a fixed floor relative to each direction's entries, raised along weak
singular directions to the round-off's reach, and the round-off's level read off the spectrum
past B."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from attacks.spearpp.factor import Factorisation
from attacks.spearpp.stages import _roundoff_level
from attacks.spearpp.zero_rule import ZeroRule, zero_mask


def _factorisation(values: list[float], b: int) -> Factorisation:
    s = torch.tensor(values, dtype=torch.float64)
    left = torch.eye(len(values) + 4, len(values), dtype=torch.float64)
    return Factorisation(left, torch.eye(len(values), dtype=torch.float64), s, b, "float-rank")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_round_off_floor_grows_along_weak_directions(seed: int) -> None:
    """The tolerance is the larger of the relative floor and roundoff x |S^-1 q|: along a
    direction weighted on a singular value 1e-6 of the largest the reach passes the floor, and
    entries moved by less than it count as zero, entries above it do not."""
    g = torch.Generator().manual_seed(seed)
    m, b = 50, 6
    left = torch.linalg.qr(torch.randn(m, b, generator=g, dtype=torch.float64)).Q
    inverse = 1 / torch.logspace(0, -6, b, dtype=torch.float64)
    q = torch.nn.functional.normalize(torch.randn(2, b, generator=g, dtype=torch.float64), dim=1)
    q[1] = torch.eye(b, dtype=torch.float64)[0]  # the strongest direction alone
    y = q @ left.T
    roundoff = 1e-13
    reach = roundoff * (q * inverse).norm(dim=1)
    floor = 1e-9 * y.abs().amax(dim=1)
    rule = ZeroRule(1e-9, 0.0, inverse, roundoff=roundoff)
    assert torch.allclose(rule.tolerance(q, y), torch.maximum(floor, reach))
    assert float(reach[0]) > 10 * float(floor[0]) and float(reach[1]) < float(floor[1])
    assert torch.equal(ZeroRule(1e-9, 0.0, inverse).tolerance(q, y), floor)
    # A column whose zeros the round-off moved to half its reach: zeros under the rule,
    # entries at twice the reach not.
    sizes = torch.full((m,), 0.5 * float(reach[0]), dtype=torch.float64)
    sizes[: m // 2] = 2 * float(reach[0])
    target = sizes * torch.sign(torch.randn(m, generator=g, dtype=torch.float64))
    direction = torch.linalg.lstsq(left, target[:, None]).solution[:, 0]
    on_rows = (direction @ left.T).abs()
    expected = on_rows <= torch.maximum(
        1e-9 * on_rows.amax(), roundoff * (direction * inverse).norm()
    )
    assert torch.equal(zero_mask(left, direction[None], rule)[0], expected)


def test_the_round_off_level_is_the_bulk_past_b_not_a_weak_sample() -> None:
    bulk = [1e-15] * 7
    assert _roundoff_level(_factorisation([1.0, 0.5, 2.5e-11, *bulk], 2)) == 1e-15
    assert _roundoff_level(_factorisation([1.0, 0.5, 0.2], 3)) == 0.0
    noisy = replace(_factorisation([1.0, 0.5, *bulk], 2), noise_std=1e-3)
    assert _roundoff_level(noisy) == 0.0
