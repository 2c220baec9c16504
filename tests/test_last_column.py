"""The last missing column in closed form from the other B - 1 and the bias gradient: exact where
the zeros alone cannot pin it, and never a wrong column."""

from __future__ import annotations

import pytest
import torch

from attacks import Reconstruction, SpearConfig, reconstruct
from attacks.spearpp.factor import Factorisation, factorise
from attacks.spearpp.last_column import LastColumn, last_column
from attacks.spearpp.refine import refine_kernel
from attacks.spearpp.zero_rule import ZeroRule
from tests.helpers import nested_batch


def _setting(
    view: dict[str, torch.Tensor],
) -> tuple[Factorisation, torch.Tensor, ZeroRule]:
    """The factorisation, the true columns (unit rows, engine coordinates) and a float64 rule."""
    b = view["x"].shape[0]
    fac = factorise(
        view["grad_weight"],
        batch_size=b,
        noise_std=None,
        precision=1e-13,
        generator=torch.Generator().manual_seed(0),
    )
    truth = torch.linalg.lstsq(fac.left, view["out_grads"]).solution.T
    rule = ZeroRule(relative=1e-13, noise_std=0.0, inverse_singular=1 / fac.singular_values[:b])
    return fac, torch.nn.functional.normalize(truth, dim=1), rule


def _last(
    view: dict[str, torch.Tensor], fac: Factorisation, found: torch.Tensor, rule: ZeroRule
) -> LastColumn | None:
    return last_column(
        found, fac.left, fac.right, view["grad_bias"], view["weight"], view["bias"], rule
    )


def _engine(
    view: dict[str, torch.Tensor],
    seed: int,
    next_layer: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Reconstruction:
    """The whole engine on a 12-sample batch of :func:`nested_batch`, batch size told."""
    return reconstruct(
        view["grad_weight"],
        view["grad_bias"],
        view["weight"],
        view["bias"],
        batch_size=12,
        next_layer=next_layer,
        config=SpearConfig(seed=seed),
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("missing", [0, 1, 5])
def test_the_last_column_is_exact(seed: int, missing: int) -> None:
    view = nested_batch(seed, rows_apart=3)
    fac, truth, rule = _setting(view)
    found = torch.cat([truth[:missing], truth[missing + 1 :]])
    last = _last(view, fac, found, rule)
    assert last is not None and last.pinned
    assert float((last.column @ truth[missing]).abs()) > 1 - 1e-10


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_column_one_row_apart_is_refused_by_its_zeros_but_settled_by_its_input(
    seed: int,
) -> None:
    # Sample 0 is zero wherever sample 1 is, but on one row: without that row its zero set's
    # null space holds both columns, so the certificate cannot tell it from a mix.
    view = nested_batch(seed, rows_apart=1)
    fac, truth, rule = _setting(view)
    gen = torch.Generator().manual_seed(seed)
    refined = refine_kernel(fac.left, truth[:1], rule, False, gen, truth[1:])
    assert not bool(refined.verified.any())
    last = _last(view, fac, truth[1:], rule)
    assert last is not None and last.pinned
    assert float((last.column @ truth[0]).abs()) > 1 - 1e-10


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_column_whose_zeros_do_not_pin_it_is_left_unpinned_with_who_is_uncertain(
    seed: int,
) -> None:
    # Sample 0 is zero only where sample 1 is: every mix of the two has its zeros, and the
    # bias gradient cannot tell them apart either; the stand-in lies in their span.
    view = nested_batch(seed, rows_apart=0)
    fac, truth, rule = _setting(view)
    last = _last(view, fac, truth[1:], rule)
    assert last is not None and not last.pinned
    assert last.uncertain.shape[0] == 1
    assert float((last.uncertain[0] @ truth[1]).abs()) > 1 - 1e-10
    span = torch.linalg.qr(truth[:2].T).Q
    assert float((span.T @ last.column).norm()) > 1 - 1e-10


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("tilt", [1e-3, 1e-6])
def test_a_wrong_found_column_never_yields_a_column(seed: int, tilt: float) -> None:
    # Tilted towards the missing column, so the span of the found ones is wrong (within their
    # span a wrong column changes nothing here).
    view = nested_batch(seed, rows_apart=3)
    fac, truth, rule = _setting(view)
    found = truth[1:].clone()
    found[2] = torch.nn.functional.normalize(found[2] + tilt * truth[0], dim=0)
    last = _last(view, fac, found, rule)
    # A tilt too small to move any neuron of the missing input across still yields its column.
    assert last is None or float((last.column @ truth[0]).abs()) > 1 - 1e-10


def test_fewer_or_more_found_columns_settle_nothing() -> None:
    view = nested_batch(0, rows_apart=3)
    fac, truth, rule = _setting(view)
    assert _last(view, fac, truth[2:], rule) is None
    assert _last(view, fac, truth, rule) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_reconstructs_a_batch_with_a_column_one_row_apart(seed: int) -> None:
    view = nested_batch(seed, rows_apart=1)
    rec = _engine(view, seed)
    assert rec.status == "exact"
    err = torch.cdist(view["x"], rec.inputs.double()).min(dim=1).values
    assert float(err.max()) < 1e-8


@pytest.mark.parametrize("seed", [0, 1])
def test_the_engine_certifies_every_sample_but_the_one_no_observation_fixes(seed: int) -> None:
    view = nested_batch(seed, rows_apart=0)
    rec = _engine(view, seed)
    assert rec.status == "partial"
    assert int(rec.certified.sum()) == 11
    err = torch.cdist(rec.inputs.double(), view["x"]).min(dim=1).values
    assert float(err[rec.certified].max()) < 1e-8
    # The uncertain one is sample 1's input mixed with sample 0's, not sample 1 itself.
    assert float(err[~rec.certified].max()) > 1e-8


@pytest.mark.parametrize("seed", [0, 1])
def test_the_next_layer_fixes_the_samples_the_first_leaves_open(seed: int) -> None:
    # A one-step update's next layer: its gradient's row space holds the hidden vectors, and
    # of the inputs the first layer allows for the uncertain sample only the true one's does.
    view = nested_batch(seed, rows_apart=0)
    rec = reconstruct(
        view["grad_weight"],
        view["grad_bias"],
        view["weight"],
        view["bias"],
        batch_size=12,
        next_layer=(view["next_grad_weight"], view["next_grad_bias"]),
        config=SpearConfig(seed=seed),
    )
    assert rec.status == "exact" and bool(rec.certified.all())
    assert rec.counts["next_layer_settled"] == 1
    err = torch.cdist(rec.inputs.double(), view["x"]).min(dim=1).values
    assert float(err.max()) < 1e-8


def test_a_next_layer_of_another_batch_settles_nothing() -> None:
    view = nested_batch(0, rows_apart=0)
    other = nested_batch(1, rows_apart=0)
    rec = reconstruct(
        view["grad_weight"],
        view["grad_bias"],
        view["weight"],
        view["bias"],
        batch_size=12,
        next_layer=(other["next_grad_weight"], other["next_grad_bias"]),
        config=SpearConfig(seed=0),
    )
    assert rec.status == "partial" and int(rec.certified.sum()) == 11
    assert rec.counts["next_layer_settled"] == 0


def test_a_next_layer_narrower_than_the_batch_settles_nothing() -> None:
    # Ten outputs for twelve samples: its row space holds only combinations of the hidden
    # vectors, not each of them.
    view = nested_batch(0, rows_apart=0)
    rec = reconstruct(
        view["grad_weight"],
        view["grad_bias"],
        view["weight"],
        view["bias"],
        batch_size=12,
        next_layer=(view["next_grad_weight"][:10], view["next_grad_bias"][:10]),
        config=SpearConfig(seed=0),
    )
    assert rec.counts["next_layer_settled"] == 0 and int(rec.certified.sum()) == 11
