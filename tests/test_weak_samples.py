"""Samples a network fits almost perfectly (memorised training images) send gradients many
decades weaker than the others'. Those under the float64 floor but clear of the round-off bulk
count in the batch size, however close the next weaker one: left out, the weakest kept sample's
input space misses their directions, and the batch loses its certificate."""

from __future__ import annotations

import pytest
import torch

from attacks import SpearConfig, reconstruct
from fl_sim.model import fc_relu_net
from tests.helpers import batch

_B, _M = 20, 200
# Loss weights of the last three samples: singular values near 1e-8, 3e-11 and 8e-13 of s_1,
# the round-off bulk near 1e-15.
_WEAK = (3e-8, 1e-10, 3e-12)


@pytest.mark.parametrize("seed", range(3))
def test_weak_samples_count_and_the_batch_stays_certified(seed: int) -> None:
    _, x, y = batch(_B, seed)
    torch.manual_seed(seed)
    net = fc_relu_net(_M, 3).double()
    weight = torch.ones(_B, dtype=torch.float64)
    weight[-len(_WEAK) :] = torch.tensor(_WEAK, dtype=torch.float64)
    per_sample = torch.nn.functional.cross_entropy(net(x), y, reduction="none")
    params = list(net.parameters())
    grads = torch.autograd.grad((per_sample * weight).mean(), params)
    rec = reconstruct(
        grads[0],
        grads[1],
        params[0].detach(),
        params[1].detach(),
        next_layer=(grads[2], grads[3], params[2].detach()),
        config=SpearConfig(seed=0, time_budget_s=30),
    )
    error = torch.cdist(x, rec.inputs.double()).min(dim=1).values / x.norm(dim=1)
    # Before: B_hat = 18 (the two weakest left out), the third weakest 1e-4 off or worse and
    # nothing certified.
    assert rec.batch_size == _B
    assert bool((error[: _B - 1] < 1e-4).all())
    assert rec.certified is not None and int(rec.certified.sum()) >= _B - 2
    # What is certified is exact: the weakest sample (input 1e-3 off, under its round-off) not.
    matched = torch.cdist(rec.inputs.double(), x).argmin(dim=1)
    assert bool((error[matched[rec.certified]] < 1e-5).all())
