"""The network's shape and finding the attacked layer inside other models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_sim.model import fc_relu_net, first_linear, next_linear


@pytest.mark.parametrize(("width", "depth"), [(200, 6), (50, 2), (30, 3)])
def test_shape_and_depth(width: int, depth: int) -> None:
    net = fc_relu_net(width, depth)
    assert sum(isinstance(m, nn.Linear) for m in net.modules()) == depth
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert first_linear(net)[1].weight.shape == (width, 3072)


def test_first_linear_inside_a_wrapper() -> None:
    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre = nn.Identity()
            self.body = fc_relu_net(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.body(self.pre(x))
            return out

    name, layer = first_linear(Wrapper())
    assert name == "body.1" and layer.out_features == 16


def test_layer_not_followed_by_relu_is_refused() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(3072, 10), nn.Tanh(), nn.Linear(10, 10))
    with pytest.raises(ValueError, match="followed by Tanh '2', not ReLU"):
        first_linear(net)


def test_depth_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="depth=1"):
        fc_relu_net(10, 1)


@pytest.mark.parametrize(("depth", "name", "out"), [(6, "3", 200), (2, "3", 10)])
def test_next_linear_takes_the_first_layers_relu_output(depth: int, name: str, out: int) -> None:
    found = next_linear(fc_relu_net(200, depth))
    assert found is not None and found[0] == name and found[1].out_features == out


def test_no_next_linear_when_something_comes_between() -> None:
    net = nn.Sequential(nn.Flatten(), nn.Linear(3072, 8), nn.ReLU(), nn.Dropout(), nn.Linear(8, 2))
    assert next_linear(net) is None
