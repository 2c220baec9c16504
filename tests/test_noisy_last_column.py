"""The last column under noise: proposed from its closed form, kept only where the noise-level
certificate verifies it and its zeros match the inactive neurons the closed form predicts."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.config import SpearConfig
from attacks.spearpp.factor import Factorisation, factorise
from attacks.spearpp.harvest import Clock, Harvester
from attacks.spearpp.last_column import noisy_last_column
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.zero_rule import ZeroRule, zero_mask

B, M, N = 8, 100, 300
NOISE = 1e-7


def _noisy_layer(seed: int) -> dict[str, torch.Tensor]:
    """A float64 layer whose biases matter next to W x (as in the SecAgg+ isolate run where a
    halfspace fit refused the true last column), its batch's gradient plus Gaussian noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, N, generator=g, dtype=torch.float64) - 0.5
    weight = torch.randn(M, N, generator=g, dtype=torch.float64) / N**0.5
    bias = 0.2 * torch.randn(M, generator=g, dtype=torch.float64)
    active = (x @ weight.T + bias > 0).T  # M x B
    out_grads = torch.randn(M, B, generator=g, dtype=torch.float64) * active
    noise = NOISE * torch.randn(M, N + 1, generator=g, dtype=torch.float64)
    return {
        "grad_weight": out_grads @ x + noise[:, :N],
        "grad_bias": out_grads.sum(dim=1) + noise[:, N],
        "weight": weight,
        "bias": bias,
        "out_grads": out_grads,
        "inactive": ~active.T,  # B x M
    }


def _setting(view: dict[str, torch.Tensor]) -> tuple[Factorisation, torch.Tensor, ZeroRule]:
    fac = factorise(
        view["grad_weight"],
        batch_size=B,
        noise_std=NOISE,
        precision=1e-13,
        generator=torch.Generator().manual_seed(0),
    )
    truth = torch.linalg.lstsq(fac.left, view["out_grads"]).solution.T
    rule = ZeroRule(relative=1e-13, noise_std=NOISE, inverse_singular=1 / fac.singular_values[:B])
    return fac, torch.nn.functional.normalize(truth, dim=1), rule


def _harvester(fac: Factorisation, rule: ZeroRule, found: torch.Tensor) -> Harvester:
    pool = ColumnPool(B, fac.left.device, spares=2 * B, same_cosine=rule.same_column_cosine)
    for q in found:
        pool.admit(q, zero_mask(fac.left, q[None], rule).sum())
    harvest = Harvester(
        fac.left,
        fac.left.float(),
        rule,
        SpearConfig(),
        pool,
        Clock(),
        torch.Generator().manual_seed(0),
    )
    return harvest


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("missing", [0, 3, 7])
def test_the_candidate_is_the_missing_column_and_its_neurons(seed: int, missing: int) -> None:
    view = _noisy_layer(seed)
    fac, truth, _ = _setting(view)
    found = torch.cat([truth[:missing], truth[missing + 1 :]])
    last = noisy_last_column(
        found, fac.left, fac.right, view["grad_bias"], view["weight"], view["bias"]
    )
    assert last is not None
    q, inactive = last
    # Noise 1e-7 against gradient entries near 1: the candidate is the column to noise level.
    assert float((q @ truth[missing]).abs()) > 1 - 1e-8
    assert float((inactive == view["inactive"][missing]).double().mean()) >= 0.99


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_harvester_settles_the_last_column_once(seed: int) -> None:
    view = _noisy_layer(seed)
    fac, truth, rule = _setting(view)
    harvest = _harvester(fac, rule, truth[1:])
    inputs = (fac.right, view["grad_bias"], view["weight"], view["bias"])
    assert harvest._closed_forms(inputs) == 1
    assert len(harvest.pool) == B and harvest.settled_last == 1
    assert float((harvest.pool.columns[-1] @ truth[0]).abs()) > 1 - 1e-8
    assert harvest._closed_forms(inputs) == 0  # tried once


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("tilt", [0.3, 0.05])
def test_a_wrong_found_column_never_yields_a_column(seed: int, tilt: float) -> None:
    # One found column tilted towards the missing one: the predicted input is another, and
    # whatever the candidate is, it is not the missing column; it must not be kept.
    view = _noisy_layer(seed)
    fac, truth, rule = _setting(view)
    found = truth[1:].clone()
    found[2] = torch.nn.functional.normalize(found[2] + tilt * truth[0], dim=0)
    harvest = _harvester(fac, rule, found)
    grew = harvest._closed_forms((fac.right, view["grad_bias"], view["weight"], view["bias"]))
    if grew:
        # Kept only if it is the missing column after all (the tilt moved no neuron across).
        assert float((harvest.pool.columns[-1] @ truth[0]).abs()) > 1 - 1e-6
