"""The activation-consistency check behind the certificate (solve.stray_zeros), in float64 over
several seeds: a true column of a one-step update has no zeros on neurons its input activates,
a cancelling mix of two binary-net columns has about half of them there."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.inputs import LayerObservation
from attacks.spearpp.isolate import isolated_samples
from attacks.spearpp.solve import (
    fits_a_column,
    inactive_noise,
    refit_to_inputs,
    solve_inputs,
    stray_zeros,
)
from attacks.spearpp.zero_rule import ZeroRule


def _binary_layer(seed: int) -> tuple[torch.Tensor, ...]:
    """One hidden layer (n=20, m=400) under a 2-class head: every sample's output gradient at
    the layer is s_i D_i w for one vector w, so any two columns have a cancelling mix."""
    g = torch.Generator().manual_seed(seed)
    b, m, n = 6, 400, 20
    x = torch.rand(b, n, generator=g, dtype=torch.float64)
    w = torch.randn(m, n, generator=g, dtype=torch.float64) / n**0.5
    bias = torch.randn(m, generator=g, dtype=torch.float64) * 0.1 - (w @ x.mean(0))
    head = torch.randn(m, generator=g, dtype=torch.float64)
    s = torch.randn(b, generator=g, dtype=torch.float64)
    up = s[:, None] * head * (x @ w.T + bias > 0)  # B x m output gradients
    return x, w, bias, up


@pytest.mark.parametrize("seed", range(5))
def test_true_columns_have_no_stray_zeros_and_a_mix_has_many(seed: int) -> None:
    x, w, bias, up = _binary_layer(seed)
    b = x.shape[0]
    gw, gb = up.T @ x, up.sum(0)
    u, sv, vh = torch.linalg.svd(gw, full_matrices=False)
    left, right = u[:, :b], sv[:b, None] * vh[:b]
    columns = torch.nn.functional.normalize(up @ left, dim=1)  # true columns, in L's basis
    obs = LayerObservation(gw, gb, w, bias, precision=1e-12)
    rule = ZeroRule(1e-10, 0.0, 1 / sv[:b])
    truth = solve_inputs(columns, left, right, obs, rule)
    assert torch.allclose(truth.inputs, x, atol=1e-8)
    assert float(stray_zeros(columns, truth.inputs, left, obs, rule).max()) == 0.0
    # Samples 0 and 1's gradients cancel wherever both are active: the mix is zero there and
    # wherever both are inactive, as sparse as a true column at activity 1/2.
    mixed = columns.clone()
    active = up != 0
    both = active[0] & active[1]
    mix = up[0] - up[1] * (up[0] / up[1])[both][0]
    mixed[0] = torch.nn.functional.normalize(mix @ left, dim=0)
    assert int((mix.abs() < 1e-12).sum()) == int((both | ~(active[0] | active[1])).sum())
    wrong = solve_inputs(mixed, left, right, obs, rule)
    stray = stray_zeros(mixed, wrong.inputs, left, obs, rule)
    assert float(stray[0]) > 0.25  # about half the mix's zeros are x_0's active neurons
    assert float(stray.max()) > 0.1  # so the batch is not certified (solve.STRAY_MAX)


@pytest.mark.parametrize("seed", range(4))
def test_noise_on_inactive_neurons_and_the_refit_to_them(seed: int) -> None:
    """Under noise of known level, a true column is noise on its input's inactive neurons
    (mean square about one noise variance), a mix of two columns is signal there; refitted to
    the inactive neurons of the (right) input in its place, the mix becomes that sample's column
    again and every input comes back."""
    g = torch.Generator().manual_seed(seed)
    b, m, n, noise = 8, 300, 40, 1e-6
    x = torch.rand(b, n, generator=g, dtype=torch.float64)
    w = torch.randn(m, n, generator=g, dtype=torch.float64) / n**0.5
    bias = torch.randn(m, generator=g, dtype=torch.float64) * 0.1 - (w @ x.mean(0))
    up = torch.randn(b, m, generator=g, dtype=torch.float64) * (x @ w.T + bias > 0)
    gw = up.T @ x + noise * torch.randn(m, n, generator=g, dtype=torch.float64)
    gb = up.sum(0)
    u, sv, vh = torch.linalg.svd(gw, full_matrices=False)
    left, right = u[:, :b], sv[:b, None] * vh[:b]
    columns = torch.nn.functional.normalize(up @ left, dim=1)
    obs = LayerObservation(gw, gb, w, bias, precision=1e-12)
    rule = ZeroRule(1e-10, noise, 1 / sv[:b])
    truth = solve_inputs(columns, left, right, obs, rule)
    quiet = inactive_noise(columns, truth.inputs, left, obs, rule)
    assert float(quiet.max()) < 3.0
    mixed = columns.clone()
    mixed[0] = torch.nn.functional.normalize(columns[0] + 0.5 * columns[1], dim=0)
    wrong = solve_inputs(mixed, left, right, obs, rule)
    assert torch.allclose(wrong.inputs[0], x[0], atol=1e-4)  # the mix's own slot is right
    assert float(inactive_noise(mixed, wrong.inputs, left, obs, rule)[0]) > 100.0
    suspects = torch.zeros(b, dtype=torch.bool)
    suspects[0] = True
    refitted = refit_to_inputs(mixed, suspects, wrong.inputs, left, obs, rule)
    assert torch.equal(refitted[1:], mixed[1:])
    assert float((refitted[0] @ columns[0]).abs()) > 1 - 1e-6
    again = solve_inputs(refitted, left, right, obs, rule)
    assert torch.allclose(again.inputs, x, atol=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_blends_that_neurons_agree_on_are_told_from_samples(seed: int) -> None:
    """In a binary net two neurons active for the same samples agree on a blend of them, as if
    one sample were alone: far more candidates than samples (what the engine refuses), and
    the column test keeps every true sample of a float64 one-step batch and few blends."""
    x, w, bias, up = _binary_layer(seed)
    b = x.shape[0]
    gw, gb = up.T @ x, up.sum(0)
    u, sv, _ = torch.linalg.svd(gw, full_matrices=False)
    left = u[:, :b]
    obs = LayerObservation(gw, gb, w, bias, precision=1e-9)
    rule = ZeroRule(1e-9, 0.0, 1 / sv[:b])
    candidates = isolated_samples(gw, gb, 1e-12, torch.Generator().manual_seed(seed))
    true = torch.cdist(candidates, x).amin(dim=1) < 1e-8
    assert len(candidates) > 10 * b
    assert bool(fits_a_column(x, left, obs, rule).all())
    fits = fits_a_column(candidates, left, obs, rule)
    assert int((fits & ~true).sum()) <= 0.1 * int((~true).sum())
