"""Samples certified by the neurons that isolate them, against the inputs they came from."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.isolate import isolated_samples, with_isolated


def _layer(
    seed: int, traps: int, b: int = 12, m: int = 300, n: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A first layer whose first ``traps`` neurons each fire for sample 0 only; the gradient
    of a batch through it with random upstream gradients (float64)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, generator=g, dtype=torch.float64)
    w = torch.randn(m, n, generator=g, dtype=torch.float64) / n**0.5
    bias = 0.01 * torch.randn(m, generator=g, dtype=torch.float64)
    for j in range(traps):
        w[j] = x[0] / x[0].norm() + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
        pre = x @ w[j]
        bias[j] = -(pre[0] + pre[1:].max()) / 2  # sample 0 above, every other below
    active = (x @ w.T + bias > 0).to(torch.float64)
    upstream = torch.randn(b, m, generator=g, dtype=torch.float64)
    out = active * upstream  # B x m, dL/dZ
    return out.T @ x, out.sum(0), x, active


@pytest.mark.parametrize("seed", range(4))
def test_two_isolating_neurons_give_the_sample_exactly(seed: int) -> None:
    gw, gb, x, active = _layer(seed, traps=2)
    assert bool((active[1:, :2] == 0).all()) and bool((active[0, :2] == 1).all())
    found = isolated_samples(gw, gb, 1e-9, torch.Generator().manual_seed(seed))
    err = (found[:, None] - x[None]).norm(dim=2) / x.norm(dim=1)
    assert bool((err.amin(dim=1) < 1e-10).all())
    assert bool((err[:, 0] < 1e-10).any())


@pytest.mark.parametrize("seed", range(4))
def test_nothing_is_certified_without_isolating_neurons(seed: int) -> None:
    gw, gb, x, active = _layer(seed, traps=0)
    found = isolated_samples(gw, gb, 1e-9, torch.Generator().manual_seed(seed))
    # Any neuron one sample fires alone would certify it; every certified row is a true input.
    if found.shape[0]:
        err = (found[:, None] - x[None]).norm(dim=2) / x.norm(dim=1)
        assert bool((err.amin(dim=1) < 1e-10).all())
    alone = (active.sum(0) == 1).sum()
    assert found.shape[0] <= int(alone)


def test_one_isolating_neuron_is_not_enough() -> None:
    # A single ratio has nothing to agree with: it could be any combination of samples.
    gw, gb, _, active = _layer(0, traps=1, b=24)
    assert int((active.sum(0) == 1).sum()) == 1
    assert isolated_samples(gw, gb, 1e-9, torch.Generator().manual_seed(0)).shape[0] == 0


def test_isolated_samples_replace_the_nearest_reconstruction() -> None:
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(5, 20, generator=g, dtype=torch.float64)
    rough = truth + 0.3 * torch.randn(5, 20, generator=g, dtype=torch.float64)
    inputs, certified = with_isolated(rough, truth[[3, 1]])
    assert certified.tolist() == [False, True, False, True, False]
    assert torch.equal(inputs[3], truth[3]) and torch.equal(inputs[1], truth[1])
    assert torch.equal(inputs[0], rough[0])
