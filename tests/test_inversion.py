"""The optimisation attack: a tiny network's single sample comes back sharp; labels; refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attacks import AttackInputError, InversionConfig, ServerView, invert_gradients, run_attack
from attacks.inversion import head_signal, recover_labels
from fl_sim.model import fc_relu_net

SHAPE = (3, 8, 8)


def _observation(
    seed: int, labels: list[int]
) -> tuple[torch.nn.Module, torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    net = fc_relu_net(32, 3, input_dim=math.prod(SHAPE)).double()
    x = torch.rand(len(labels), *SHAPE, dtype=torch.float64)
    loss = torch.nn.functional.cross_entropy(net(x), torch.tensor(labels))
    names = [k for k, _ in net.named_parameters()]
    return net, x, dict(zip(names, torch.autograd.grad(loss, list(net.parameters())), strict=True))


@pytest.mark.parametrize("loss", ["cosine", "l2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_single_sample_of_a_tiny_network_comes_back_sharp(loss: str, seed: int) -> None:
    net, x, gradient = _observation(seed, [seed + 2])
    weights = {k: v.detach().clone() for k, v in net.named_parameters()}
    rec = invert_gradients(
        net.to("meta"),  # the architecture alone: the weights come separately
        weights,
        [gradient],
        input_shape=SHAPE,
        batch_size=1,
        bounds=(torch.zeros(3, 1, 1), torch.ones(3, 1, 1)),
        config=InversionConfig(loss=loss, iterations=200, restarts=1, device="cpu", seed=seed),  # type: ignore[arg-type]
    )[0]
    mse = float((rec.inputs.reshape(1, *SHAPE) - x).square().mean())
    assert 10 * math.log10(1 / mse) > 50, mse
    assert rec.status == "approximate" and rec.settings["label_values"] == [seed + 2]
    assert rec.settings["labels"] == "recovered" and float(rec.confidence[0]) > 0.999


def test_labels_from_the_head() -> None:
    net, _, gradient = _observation(0, [1, 1, 3, 7])
    signal = head_signal(net, gradient)
    assert torch.equal(signal, gradient["5.bias"])
    assert recover_labels(signal, 4).tolist() == [1, 1, 3, 7]
    assert recover_labels(torch.tensor([0.1, -0.9, 0.2]), 1).tolist() == [1]
    head = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
    rows = torch.tensor([[1.0, 2.0], [-3.0, -1.0]])
    assert head_signal(head, {"0.weight": rows}).tolist() == [3.0, -4.0]


def test_refusals_name_the_input() -> None:
    net, _, gradient = _observation(0, [1])
    weights = {k: v.detach() for k, v in net.named_parameters()}
    partial = {k: v for k, v in gradient.items() if k != "3.weight"}
    with pytest.raises(AttackInputError, match=r"lacks parameters \['3.weight'\]"):
        invert_gradients(net, weights, [partial], input_shape=SHAPE, batch_size=1)
    bad = {**gradient, "1.bias": gradient["1.bias"] * float("nan")}
    with pytest.raises(AttackInputError, match="NaN"):
        invert_gradients(net, weights, [bad], input_shape=SHAPE, batch_size=1)
    with pytest.raises(AttackInputError, match="rows of 1 labels"):
        invert_gradients(net, weights, [gradient], input_shape=SHAPE, batch_size=1, labels=[[1, 2]])
    view = ServerView(
        {k: v.numpy() for k, v in weights.items()},
        {k: v.numpy() for k, v in gradient.items()},
        ("1.weight", "1.bias"),
    )
    with pytest.raises(AttackInputError, match="allowed are analytic, inversion, spearpp"):
        run_attack("dlg", view, InversionConfig())
    with pytest.raises(AttackInputError, match="takes a InversionConfig"):
        run_attack("inversion", view, object())
    with pytest.raises(AttackInputError, match="architecture"):
        run_attack("inversion", view, InversionConfig())
    with pytest.raises(ValueError, match="allowed are l2, cosine"):
        InversionConfig(loss="l1")  # type: ignore[arg-type]


def test_registry_estimates_the_batch_size_from_the_first_layer() -> None:
    net, _, gradient = _observation(3, [0, 4])
    view = ServerView(
        {k: v.detach().numpy() for k, v in net.named_parameters()},
        {k: v.numpy() for k, v in gradient.items()},
        ("1.weight", "1.bias"),
        architecture=net,
        input_shape=SHAPE,
        labels=(0, 4),
    )
    rec = run_attack("inversion", view, InversionConfig(iterations=20, restarts=1, device="cpu"))
    assert rec.batch_size == 2 and rec.batch_size_method == "float-rank"
    assert rec.settings["labels"] == "known" and rec.inputs.shape == (2, math.prod(SHAPE))
    assert np.isfinite(rec.inputs.numpy()).all()
