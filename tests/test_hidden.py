"""Found samples' input coordinates from the next layer's gradient: exact on one step, refused
where the hidden vectors do not span B dimensions."""

from __future__ import annotations

import pytest
import torch

from attacks import SpearConfig, reconstruct
from attacks.spearpp.hidden import RESIDUAL, hidden_inputs, hidden_space
from attacks.spearpp.inputs import NextLayer
from fl_sim.model import fc_relu_net


def _update(
    seed: int, steps: int = 1, b: int = 8, n: int = 40, m: int = 60, shift: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, NextLayer, torch.Tensor]:
    """A depth-3 network's inputs (B x n, ``shift`` added: un-centred inputs), its first layer's
    affine map [W, b] (m x (n + 1)) as sent, and the next layer's gradient-equivalent of
    ``steps`` SGD steps on the batch."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = fc_relu_net(m, 3, input_dim=n).double()
    x = torch.randn(b, n, generator=gen, dtype=torch.float64) + shift
    y = torch.randint(0, 10, (b,), generator=gen)
    first, second = net[1], net[3]
    affine = torch.cat([first.weight, first.bias[:, None]], dim=1).detach().clone()
    before = (second.weight.detach().clone(), second.bias.detach().clone())
    lr = 0.1
    for _ in range(steps):
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
    after = (second.weight.detach(), second.bias.detach())
    nxt = NextLayer((before[0] - after[0]) / lr, (before[1] - after[1]) / lr)
    return x, affine, nxt, (x @ affine[:, :-1].T + affine[:, -1]) > 0


def _coordinates(x: torch.Tensor, affine: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[A, b] in coordinates of the inputs' span (V: n x B) and the inputs' coordinates."""
    basis = torch.linalg.qr(x.T).Q
    return torch.cat([affine[:, :-1] @ basis, affine[:, -1:]], dim=1), x @ basis


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_one_step_gives_every_sample_exactly(seed: int, shift: float) -> None:
    x, affine, nxt, active = _update(seed, shift=shift)
    space = hidden_space(nxt, x.shape[0])
    assert space is not None
    pre, truth = _coordinates(x, affine)
    coords, residual = hidden_inputs(pre, active, space)
    assert (residual < 1e-10).all()
    torch.testing.assert_close(coords, truth, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_mixed_pattern_leaves_a_residual(seed: int) -> None:
    """A mix of two columns is zero where both samples are: the union of their patterns."""
    x, affine, nxt, active = _update(seed)
    space = hidden_space(nxt, x.shape[0])
    assert space is not None
    pre, _ = _coordinates(x, affine)
    mixes = torch.stack([active[i] | active[i + 1] for i in range(x.shape[0] - 1)])
    _, residual = hidden_inputs(pre, mixes, space)
    assert (residual > 1e3 * RESIDUAL).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_several_steps_give_no_estimate(seed: int) -> None:
    """Three steps' hidden vectors move: no B-dimensional space holds them, so either no space
    is found or no pattern fits it."""
    x, affine, nxt, active = _update(seed, steps=3)
    space = hidden_space(nxt, x.shape[0])
    if space is not None:
        pre, _ = _coordinates(x, affine)
        _, residual = hidden_inputs(pre, active, space)
        assert (residual >= RESIDUAL).all()


def test_a_next_layer_narrower_than_the_batch_gives_no_space() -> None:
    _, _, nxt, _ = _update(0, b=8)
    assert hidden_space(NextLayer(nxt.grad_weight[:5], nxt.grad_bias[:5]), 8) is None
    assert hidden_space(nxt, 9) is None  # rank 8 where 9 samples are claimed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_takes_the_next_layer_on_every_view(seed: int) -> None:
    """Un-centred inputs leave neurons silent, so the search runs on the live rows too, where
    the row space is restricted to them: every sample comes back exact."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = fc_relu_net(120, 3, input_dim=50).double()
    x = torch.rand(12, 50, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (12,), generator=gen)
    torch.nn.functional.cross_entropy(net(x), y).backward()
    first, second = net[1], net[3]
    assert first.weight.grad is not None and second.weight.grad is not None
    rec = reconstruct(
        first.weight.grad,
        first.bias.grad,
        first.weight.detach(),
        first.bias.detach(),
        next_layer=(second.weight.grad, second.bias.grad),
        config=SpearConfig(seed=seed),
    )
    assert rec.status == "exact"
    error = (rec.inputs[:, None] - x[None]).norm(dim=2).amin(dim=0)
    assert float(error.max()) < 1e-8
