"""The last two missing columns from the other B - 2 in closed form: exact where the zeros pin
them, never a wrong column, and wired into the engine's pool."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.config import SpearConfig
from attacks.spearpp.factor import factorise
from attacks.spearpp.harvest import Clock, Harvester
from attacks.spearpp.inputs import FLOAT32_PRECISION
from attacks.spearpp.last_pair import last_pair
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.zero_rule import ZeroRule
from tests.helpers import nested_batch
from tests.test_last_column import _setting

_PAIRS = [(0, 1), (0, 5), (3, 7), (10, 11)]


def _pair(view: dict[str, torch.Tensor], found: torch.Tensor, rule: ZeroRule) -> torch.Tensor:
    fac, _, _ = _setting(view)
    return last_pair(
        found, fac.left, fac.right, view["grad_bias"], view["weight"], view["bias"], rule
    ).columns


def _without(truth: torch.Tensor, missing: tuple[int, ...]) -> torch.Tensor:
    return truth[[i for i in range(truth.shape[0]) if i not in missing]]


def _is_among(got: torch.Tensor, columns: torch.Tensor) -> bool:
    """Whether every row of ``got`` is one of ``columns`` (up to sign, to 1e-10)."""
    return bool(((got @ columns.T).abs().amax(dim=1) > 1 - 1e-10).all())


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("rows_apart", [1, 3])
@pytest.mark.parametrize("missing", _PAIRS)
def test_the_last_two_columns_are_exact(
    seed: int, rows_apart: int, missing: tuple[int, int]
) -> None:
    # Sample 0 is zero wherever sample 1 is but on one or three rows: the search's hardest
    # case, and the certificate refuses its column, but its input pins it.
    view = nested_batch(seed, rows_apart=rows_apart)
    _, truth, rule = _setting(view)
    got = _pair(view, _without(truth, missing), rule)
    assert got.shape[0] == 2
    assert _is_among(got, truth[list(missing)])
    assert float((got[0] @ got[1]).abs()) < 1 - 1e-6  # two columns, not one twice


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("missing", _PAIRS)
def test_a_sample_whose_zeros_do_not_pin_it_never_yields_a_wrong_column(
    seed: int, missing: tuple[int, int]
) -> None:
    # Sample 0 is zero only where sample 1 is. A neighbouring segment's null direction is then
    # a mix of the two columns pinned by its extra row, with exactly that segment's zeros: only
    # the check of the sample's own input turns it down (without it, seed 5 of (0, 5) returns
    # the mix).
    view = nested_batch(seed, rows_apart=0)
    _, truth, rule = _setting(view)
    got = _pair(view, _without(truth, missing), rule)
    assert _is_among(got, truth[list(missing)])
    if 0 not in missing:
        assert got.shape[0] == 2  # the unpinned sample was found: the pair is pinned


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("tilt", [1e-3, 1e-6])
def test_a_wrong_found_column_never_yields_a_wrong_column(seed: int, tilt: float) -> None:
    # Tilted towards a missing column: the plane of the missing ones is then wrong.
    view = nested_batch(seed, rows_apart=3)
    _, truth, rule = _setting(view)
    found = truth[2:].clone()
    found[3] = torch.nn.functional.normalize(found[3] + tilt * truth[0], dim=0)
    assert _is_among(_pair(view, found, rule), truth[:2])


def test_other_counts_of_found_columns_settle_nothing() -> None:
    view = nested_batch(0, rows_apart=3)
    _, truth, rule = _setting(view)
    for found in (truth[3:], truth[1:], truth):
        assert _pair(view, found, rule).shape[0] == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_completes_a_pool_two_short(seed: int) -> None:
    # The harvester settles the last two once the search has proposed the other B - 2.
    view = nested_batch(seed, rows_apart=1)
    fac, truth, rule = _setting(view)
    b = truth.shape[0]
    pool = ColumnPool(b, truth.device, spares=2 * b, same_cosine=rule.same_column_cosine)
    harvest = Harvester(
        fac.left,
        fac.left,
        rule,
        SpearConfig(),
        pool,
        Clock(),
        torch.Generator().manual_seed(seed),
    )
    harvest.inputs = (fac.right, view["grad_bias"], view["weight"], view["bias"])
    # Sample 0's column is refused by the certificate (one row apart), so it stays missing.
    grew = harvest.propose(_without(truth, (0, 4)))
    assert len(pool) == b and grew == b
    assert harvest.settled_last == 2
    assert _is_among(truth, pool.columns)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_engine_certifies_the_pinned_one_of_a_pair_whose_other_is_unpinned(seed: int) -> None:
    # Sample 0 is zero only where sample 1 is, both missing: sample 1's input is not fixed
    # (sample 0's column is known only up to sample 1's), so its column from the scan goes to
    # the certificate, and the last column's stand-in then leaves sample 1 uncertain.
    view = nested_batch(seed, rows_apart=0)
    fac, truth, rule = _setting(view)
    scan = last_pair(
        _without(truth, (0, 1)),
        fac.left,
        fac.right,
        view["grad_bias"],
        view["weight"],
        view["bias"],
        rule,
    )
    assert scan.columns.shape[0] == 0 and _is_among(truth[1:2], scan.candidates)
    pool = ColumnPool(12, truth.device, spares=24, same_cosine=rule.same_column_cosine)
    gen = torch.Generator().manual_seed(seed)
    harvest = Harvester(fac.left, fac.left, rule, SpearConfig(), pool, Clock(), gen)
    harvest.inputs = (fac.right, view["grad_bias"], view["weight"], view["bias"])
    harvest.propose(_without(truth, (0, 1)))
    assert len(pool) == 11 and _is_among(pool.columns, truth[1:])
    assert harvest.unpinned is not None and _is_among(harvest.unpinned.uncertain, truth[1:2])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_float32_gradient_never_yields_a_wrong_column(seed: int) -> None:
    # At float32's round-off no segment's rows are null to the closed form's share.
    view = nested_batch(seed, rows_apart=1)
    for key in ("grad_weight", "grad_bias"):
        view[key] = view[key].float().double()
    b = view["x"].shape[0]
    fac = factorise(
        view["grad_weight"],
        batch_size=b,
        noise_std=None,
        precision=FLOAT32_PRECISION,
        generator=torch.Generator().manual_seed(seed),
    )
    truth = torch.nn.functional.normalize(
        torch.linalg.lstsq(fac.left, view["out_grads"]).solution.T, dim=1
    )
    rule = ZeroRule(
        relative=FLOAT32_PRECISION, noise_std=0.0, inverse_singular=1 / fac.singular_values[:b]
    )
    scan = last_pair(
        truth[2:], fac.left, fac.right, view["grad_bias"], view["weight"], view["bias"], rule
    )
    assert scan.columns.shape[0] == 0 and scan.candidates.shape[0] == 0
