"""Local training by defence: each procedure's update checked against a direct computation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from clients import DivergenceError, train_locally, training, training_settings
from fl_sim.model import fc_relu_net, first_linear
from strategies import update_as_gradient


def _setup(seed: int, b: int = 12) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = fc_relu_net(20, 3, input_dim=15).double()
    x = torch.randn(b, 15, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (b,), generator=g)
    return net, x, y


def _first_weight(net: nn.Module) -> torch.Tensor:
    return first_linear(net)[1].weight.detach().clone()


@pytest.mark.parametrize("seed", range(3))
def test_fedsgd_update_is_minus_lr_gradient(seed: int) -> None:
    net, x, y = _setup(seed)
    before = _first_weight(net)
    nn.functional.cross_entropy(net(x), y).backward()
    grad = first_linear(net)[1].weight.grad
    assert grad is not None
    grad = grad.clone()
    net.zero_grad()
    res = train_locally(net, x, y, training_settings("fedsgd", lr=0.05), torch.Generator())
    assert res.steps == 1 and res.noise_std == 0.0
    assert torch.allclose(update_as_gradient(before, _first_weight(net), 0.05), grad, atol=1e-12)


@pytest.mark.parametrize(("b", "mini", "epochs"), [(12, 5, 3), (12, 12, 2), (10, 3, 1)])
def test_fedavg_takes_epochs_times_batches_steps(b: int, mini: int, epochs: int) -> None:
    net, x, y = _setup(0, b)
    cfg = training_settings("fedavg", lr=0.01, epochs=epochs, mini_batch=mini)
    res = train_locally(net, x, y, cfg, torch.Generator().manual_seed(0))
    assert res.steps == epochs * math.ceil(b / mini)


def test_dp_without_noise_is_mean_of_clipped_per_sample_gradients() -> None:
    net, x, y = _setup(1)
    reference = fc_relu_net(20, 3, input_dim=15).double()
    reference.load_state_dict(net.state_dict())
    clip = 0.05
    before = _first_weight(net)
    cfg = training_settings("dp", lr=0.1, clip=clip, noise_multiplier=0.0)
    train_locally(net, x, y, cfg, torch.Generator().manual_seed(0))
    # Brute force: per-sample gradients of all parameters, clipped by their joint norm.
    total = torch.zeros_like(before)
    for i in range(len(x)):
        reference.zero_grad()
        nn.functional.cross_entropy(reference(x[i : i + 1]), y[i : i + 1]).backward()
        grads = [p.grad for p in reference.parameters() if p.grad is not None]
        norm = torch.sqrt(sum(g.square().sum() for g in grads))
        first = first_linear(reference)[1].weight.grad
        assert first is not None
        total += first * min(1.0, clip / float(norm))
    expected = total / len(x)
    assert torch.allclose(update_as_gradient(before, _first_weight(net), 0.1), expected, atol=1e-10)


@pytest.mark.parametrize("physical", [1, 5])
@pytest.mark.parametrize("poisson", [False, True])
def test_dp_in_chunks_takes_the_same_steps(
    physical: int, poisson: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-sample gradients held a few samples at a time (big models) change nothing: the same
    clipping, the same noise draw, the same update as on the whole mini-batch at once."""
    cfg = training_settings(
        "dp", lr=0.1, clip=0.05, noise_multiplier=0.3, epochs=2, mini_batch=8, poisson=poisson
    )
    updates = []
    per_sample = sum(p.numel() * p.element_size() for p in _setup(3)[0].parameters())
    for budget in (1 << 40, physical * per_sample):
        monkeypatch.setattr(training, "PER_SAMPLE_BUDGET", budget)
        net, x, y = _setup(3)
        before = _first_weight(net)
        res = train_locally(net, x, y, cfg, torch.Generator().manual_seed(0))
        updates.append((update_as_gradient(before, _first_weight(net), 0.1), res.loss))
    (whole, loss_whole), (chunked, loss_chunked) = updates
    assert training.physical_batch(_setup(3)[0], training.PER_SAMPLE_BUDGET) == physical
    assert torch.allclose(whole, chunked, atol=1e-12)
    assert loss_chunked == pytest.approx(loss_whole, rel=1e-12)


def test_dp_noise_has_the_configured_scale() -> None:
    net, x, y = _setup(2, b=8)
    before = _first_weight(net)
    cfg = training_settings("dp", lr=1.0, clip=1.0, noise_multiplier=50.0)
    res = train_locally(net, x, y, cfg, torch.Generator().manual_seed(0))
    assert res.noise_std == pytest.approx(50.0 * 1.0 / 8)
    # Clipped signal is at most clip / 1 per entry; noise dominates at sigma = 50.
    empirical = float(update_as_gradient(before, _first_weight(net), 1.0).std())
    assert empirical == pytest.approx(res.noise_std, rel=0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"defence": "secure"}, "allowed are fedsgd, fedavg, dp"),
        ({"lr": 0.0}, "lr=0.0"),
        ({"defence": "fedsgd", "epochs": 2}, "one full-batch step"),
        ({"defence": "dp", "clip": 0.0}, "need clip > 0"),
    ],
)
def test_bad_training_settings_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        training_settings(**kwargs)  # type: ignore[arg-type]


def test_poisson_sampling_draws_random_batch_sizes() -> None:
    from clients.training import batches

    draws = batches(40, 8, 50, torch.Generator().manual_seed(0), poisson=True)
    sizes = torch.tensor([len(d) for d in draws], dtype=torch.float64)
    assert len(draws) == 50 * 5 and sizes.std() > 0
    assert float(sizes.mean()) == pytest.approx(8, rel=0.1)
    net, x, y = _setup(3, b=10)
    cfg = training_settings("dp", lr=0.1, mini_batch=5, noise_multiplier=1.0, poisson=True)
    res = train_locally(net, x, y, cfg, torch.Generator().manual_seed(1))
    assert res.steps == 2 and res.sample_rate == 0.5


def test_non_finite_loss_is_divergence() -> None:
    net, x, y = _setup(4)
    x[0, 0] = math.nan
    with pytest.raises(DivergenceError, match="training loss is nan"):
        train_locally(net, x, y, training_settings("fedsgd"), torch.Generator())


def test_non_finite_weights_are_divergence() -> None:
    net, x, y = _setup(5)  # the step's loss is finite, the weights it leaves are not
    with pytest.raises(DivergenceError, match=r"weights \[.*\] hold NaN or infinite"):
        train_locally(net, x, y, training_settings("fedsgd", lr=math.inf), torch.Generator())


def test_a_blown_up_loss_is_divergence_when_asked() -> None:
    cfg = training_settings("dp", lr=1e4, clip=2.0, noise_multiplier=1.0)
    net, x, y = _setup(6)
    res = train_locally(net, x, y, cfg, torch.Generator().manual_seed(0))  # finite: no limit
    assert math.isfinite(res.loss) and res.first_loss == res.loss  # one step
    net, x, y = _setup(6)
    with pytest.raises(DivergenceError, match=r"loss on its batch went from 2\.\d+ to \S+e\+11"):
        train_locally(net, x, y, cfg, torch.Generator().manual_seed(0), training.DIVERGENCE_FACTOR)
    net, x, y = _setup(6)  # ordinary training stays well within the limit
    train_locally(
        net,
        x,
        y,
        training_settings("fedsgd", lr=0.1),
        torch.Generator(),
        training.DIVERGENCE_FACTOR,
    )
