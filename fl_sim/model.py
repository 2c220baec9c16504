"""The fully connected ReLU network under attack, and locating a model's first linear layer."""

from __future__ import annotations

import torch
from torch import fx, nn

from fl_sim.attacked_layer import traced_layers

# CIFAR-10's (3 x 32 x 32 images, 10 classes): the defaults of the benchmarks and tests; a
# run's network takes both from its data (:meth:`fl_sim.config.schema.ModelSpec.build`).
INPUT_DIM = 3 * 32 * 32
NUM_CLASSES = 10
# What torch.fx raises on a forward it cannot trace (control flow on values, calls it cannot
# follow): the model's declaration order is read instead.
_UNTRACEABLE = (fx.proxy.TraceError, TypeError, RuntimeError, NotImplementedError)


def fc_relu_net(
    width: int = 200, depth: int = 6, input_dim: int = INPUT_DIM, num_classes: int = NUM_CLASSES
) -> nn.Sequential:
    """``Flatten -> Linear(n, m) -> ReLU -> [Linear(m, m) -> ReLU] x (depth - 2) -> Linear(m, k)``
    for n inputs and k classes.

    Depth 6 is the network of the SPEAR and SPEAR++ evaluations; depth 2 is one hidden layer.
    """
    if depth < 2:
        raise ValueError(f"depth={depth}: the network needs at least 2 linear layers")
    if width < 1:
        raise ValueError(f"width={width}: must be >= 1")
    if num_classes < 2:
        raise ValueError(f"num_classes={num_classes}: a classifier needs at least 2")
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(input_dim, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules without children, in registration order: the layers as data flows."""
    return [(n, m) for n, m in model.named_modules() if not list(m.children())]


def array_keys(name: str) -> tuple[str, str]:
    """ArrayRecord (state dict) keys of the weight and bias of the linear layer ``name``."""
    return f"{name}.weight", f"{name}.bias"


def first_linear(model: nn.Module, layer: str | None = None) -> tuple[str, nn.Linear]:
    """Name and module of the layer SPEAR++ attacks: ``layer`` if named, else the first
    ``nn.Linear`` the input reaches, found by what ``forward`` computes
    (:func:`fl_sim.attacked_layer.traced_layers`) and checked to feed a ReLU alone. A
    ``forward`` torch.fx cannot trace falls back to declaration order: the first ``nn.Linear``
    declared, with an ``nn.ReLU`` declared next.

    Raises
    ------
    ValueError
        Naming what was found where no such layer is (a convolution first, a sigmoid after).
    """
    try:
        name = traced_layers(model, layer)[0]
    except _UNTRACEABLE:
        name = layer if layer is not None else _declared_layers(model)[0]
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"layer={name!r}: the model has no module of that name") from None
    if not isinstance(module, nn.Linear):
        raise ValueError(f"layer={name!r} is a {type(module).__name__}, not an nn.Linear")
    return name, module


def next_linear(model: nn.Module) -> tuple[str, nn.Linear] | None:
    """Name and module of the linear layer that takes the first linear layer's ReLU output
    directly (``Linear -> ReLU -> Linear``), or ``None`` when something else comes between."""
    try:
        following = traced_layers(model)[1]
    except _UNTRACEABLE:
        following = _declared_layers(model)[1]
    if following is None:
        return None
    module = model.get_submodule(following)
    return (following, module) if isinstance(module, nn.Linear) else None


def _declared_layers(model: nn.Module) -> tuple[str, str | None]:
    """The first ``nn.Linear`` in declaration order, checked to have an ``nn.ReLU`` declared
    right after it, and the leaf declared after that if it is an ``nn.Linear``."""
    leaves = _leaves(model)
    for i, (name, module) in enumerate(leaves):
        if isinstance(module, nn.Linear):
            after = leaves[i + 1][1] if i + 1 < len(leaves) else None
            if not isinstance(after, nn.ReLU):
                raise ValueError(
                    f"the first linear layer {name!r} is followed by {type(after).__name__}, "
                    "not ReLU: SPEAR++ needs a ReLU right after the attacked layer"
                )
            following = leaves[i + 2] if i + 2 < len(leaves) else None
            is_linear = following is not None and isinstance(following[1], nn.Linear)
            return name, following[0] if following is not None and is_linear else None
    raise ValueError("the model has no nn.Linear layer to attack")


def layer_gradients(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy gradient of ``model``'s first linear layer (weight, bias) on one batch."""
    _, layer = first_linear(model)
    model.zero_grad()
    nn.functional.cross_entropy(model(inputs), labels).backward()
    if layer.weight.grad is None or layer.bias.grad is None:
        raise ValueError("the first linear layer does not require gradients: nothing to compute")
    return layer.weight.grad.detach().clone(), layer.bias.grad.detach().clone()
