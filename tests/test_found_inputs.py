"""The pool's samples' input coordinates: exact from the next layer, a verified mix evicted once
the row space is trusted and its rank is B exactly, max-margin fits otherwise."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from attacks.spearpp.config import SpearConfig
from attacks.spearpp.factor import Factorisation, factorise
from attacks.spearpp.found_inputs import FoundInputs
from attacks.spearpp.harvest import Clock, Harvester
from attacks.spearpp.hidden import next_layer_bases
from attacks.spearpp.inputs import NextLayer
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.signs import SignGeometry
from attacks.spearpp.zero_rule import ZeroRule, zero_mask
from fl_sim.model import fc_relu_net

B = 10


def _setting(
    seed: int,
) -> tuple[Factorisation, SignGeometry, torch.Tensor, torch.Tensor, NextLayer, ZeroRule]:
    """A one-step update of a depth-3 net (n=40, m=80): its factorisation and geometry, the
    true columns (engine coordinates, one per row), the inputs' search coordinates, the next
    layer's gradient and the zero rule."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = fc_relu_net(80, 3, input_dim=40).double()
    x = torch.randn(B, 40, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (B,), generator=gen)
    z = net[1](x)
    z.retain_grad()
    torch.nn.functional.cross_entropy(net[2:](z), y).backward()
    first, second = net[1], net[3]
    grads = (z.grad, first.weight.grad, second.weight.grad, second.bias.grad)
    assert all(g is not None for g in grads)
    fac = factorise(
        first.weight.grad,
        batch_size=B,
        noise_std=None,
        precision=1e-15,
        generator=torch.Generator().manual_seed(seed),
    )
    weight, bias = first.weight.detach(), first.bias.detach()
    geom = SignGeometry.build(fac.left, fac.right, weight, bias)
    columns = torch.linalg.lstsq(fac.left, z.grad.T).solution.T
    coords = x @ (fac.right / fac.right.norm(dim=1, keepdim=True)).T
    rule = ZeroRule(1e-9, 0.0, 1 / fac.singular_values[:B])
    nxt = NextLayer(second.weight.grad, second.bias.grad)
    return fac, geom, torch.nn.functional.normalize(columns, dim=1), coords, nxt, rule


def _found(
    seed: int,
    columns: Callable[[torch.Tensor], torch.Tensor],
    hidden: bool = True,
    exact_rank: bool = True,
    tilted: bool = False,
) -> tuple[FoundInputs, ColumnPool, torch.Tensor, torch.Tensor]:
    fac, geom, truth, coords, nxt, rule = _setting(seed)
    pool = ColumnPool(B, truth.device, spares=2 * B, same_cosine=rule.same_column_cosine)
    picked = columns(truth)
    for column in picked:
        pool.admit(column, zero_mask(fac.left, column[None], rule).sum())
    gen = torch.Generator().manual_seed(seed)
    harvest = Harvester(fac.left, fac.left, rule, SpearConfig(), pool, Clock(), gen)
    bases = next_layer_bases(nxt, B)
    assert bases is not None and bases.exact
    if not exact_rank:  # as where the faintest samples fade into the round-off
        bases = bases._replace(exact=False)
    found = FoundInputs(harvest, geom, bases._replace(tilted=tilted) if hidden else None, B)
    found.update()
    return found, pool, truth, coords


def _and_a_mix(count: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The first ``count`` true columns and a mix of columns 7 and 8 (zero where both are)."""

    def columns(truth: torch.Tensor) -> torch.Tensor:
        mix = torch.nn.functional.normalize(truth[7] + truth[8], dim=0)
        return torch.cat([truth[:count], mix[None]])

    return columns


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_coordinates_and_a_verified_mix_evicted(seed: int) -> None:
    found, pool, truth, coords = _found(seed, _and_a_mix(7))
    assert len(pool) == 7 and found.exact
    torch.testing.assert_close(pool.columns, truth[:7])
    torch.testing.assert_close(found.inputs, coords[:7], rtol=1e-8, atol=1e-8)
    # Not banned: the columns it mixes stay reachable.
    assert not bool(pool.near_found(truth[7:9], 0.999).any())
    assert found.basis is not None and found.basis.shape == (B, 7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_row_space_of_no_exact_rank_gives_exact_coordinates_and_evicts_nothing(
    seed: int,
) -> None:
    found, pool, truth, coords = _found(seed, _and_a_mix(7), exact_rank=False)
    assert len(pool) == 8 and not found.exact
    torch.testing.assert_close(pool.columns[:7], truth[:7])
    torch.testing.assert_close(found.inputs[:7], coords[:7], rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_mix_among_few_found_is_kept_and_the_deflation_is_not_exact(seed: int) -> None:
    found, pool, _, coords = _found(seed, _and_a_mix(1))
    assert len(pool) == 2 and not found.exact
    torch.testing.assert_close(found.inputs[:1], coords[:1], rtol=1e-8, atol=1e-8)


def test_without_the_next_layer_the_fits_are_max_margin() -> None:
    found, pool, _, coords = _found(0, lambda truth: truth[:7], hidden=False)
    assert len(pool) == 7 and not found.exact
    cosine = torch.nn.functional.cosine_similarity(found.inputs, coords[:7], dim=1)
    assert bool((cosine > 0.5).all()) and not torch.allclose(found.inputs, coords[:7])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_columns_tilted_past_the_zero_floor_give_exact_coordinates(seed: int) -> None:
    """Each column leaning 1e-6 towards the next (as samples fading past B_hat tilt them): over
    the zero rule's floor (1e-9) it reads the union of both patterns, which the row space does
    not hold; a gap of the column's magnitudes gives its own."""

    def tilted(truth: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(truth[:7] + 1e-6 * truth[1:8], dim=1)

    found, pool, _, coords = _found(seed, tilted, exact_rank=False, tilted=True)
    assert len(pool) == 7 and found.exact
    torch.testing.assert_close(found.inputs, coords[:7], rtol=1e-8, atol=1e-8)
    # Where no faint sample is known to tilt them (bases.tilted false) only the zero rule's
    # patterns are tried.
    assert not _found(seed, tilted, exact_rank=False)[0].exact
