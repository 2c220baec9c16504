"""Which layer SPEAR++ attacks, found by what ``forward`` computes (traced with torch.fx), not by
the order modules are declared in: the first ``nn.Linear`` the input reaches through reshapes
alone, checked to feed a ReLU and nothing else (``nn.ReLU``, reused or not, in place or not,
``F.relu``, ``torch.relu``, ``.relu()``)."""

from __future__ import annotations

import torch
from torch import fx, nn
from torch.nn import functional as F

# What passes the input on unchanged but for its shape (and dtype): the attacked layer may sit
# behind these.
_SHAPE_FUNCTIONS = {torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze}
_SHAPE_METHODS = {
    "view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous", "float", "double", "to",
    "type",
}  # fmt: skip
_SHAPE_MODULES = (nn.Flatten, nn.Unflatten, nn.Identity)
_RELU_FUNCTIONS = {torch.relu, torch.relu_, F.relu, F.relu_}
# What reads the input's shape, not its values (``x.view(x.size(0), -1)``).
_INSPECT_METHODS = {"size", "dim", "numel"}
_RELU_METHODS = {"relu", "relu_"}


class LayerError(ValueError):
    """The model has no first linear layer SPEAR++ can attack: says what was found instead."""


def _what(node: fx.Node, model: nn.Module) -> str:
    if node.op == "call_module":
        return f"{type(model.get_submodule(str(node.target))).__name__} {node.target!r}"
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method":
        return f".{node.target}()"
    return node.op


def _is_relu(node: fx.Node, model: nn.Module) -> bool:
    if node.op == "call_module":
        return type(model.get_submodule(str(node.target))) is nn.ReLU
    if node.op == "call_function":
        return node.target in _RELU_FUNCTIONS
    return node.op == "call_method" and node.target in _RELU_METHODS


def _is_shape(node: fx.Node, model: nn.Module) -> bool:
    if node.op == "call_module":
        return isinstance(model.get_submodule(str(node.target)), _SHAPE_MODULES)
    if node.op == "call_function":
        return node.target in _SHAPE_FUNCTIONS
    return node.op == "call_method" and node.target in _SHAPE_METHODS


def _inspects(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target is getattr
    return node.op == "call_method" and node.target in _INSPECT_METHODS


def _module(node: fx.Node, model: nn.Module) -> nn.Module | None:
    return model.get_submodule(str(node.target)) if node.op == "call_module" else None


def _first_reached(graph: fx.Graph, model: nn.Module) -> fx.Node:
    """The first nn.Linear the input reaches through reshapes alone."""
    reach = {n for n in graph.nodes if n.op == "placeholder"}  # the input, reshaped at most
    node: fx.Node
    for node in graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if not any(a in reach for a in node.all_input_nodes) or _inspects(node):
            continue
        if isinstance(_module(node, model), nn.Linear):
            return node
        if not _is_shape(node, model):
            raise LayerError(
                f"the input reaches {_what(node, model)} before any nn.Linear: SPEAR++ recovers "
                "what a linear layer followed by ReLU takes in, here not the input (name a layer "
                "with layer= to audit what reaches it)"
            )
        reach.add(node)
    raise LayerError("the input reaches no nn.Linear through reshapes alone: nothing to attack")


def traced_layers(model: nn.Module, layer: str | None = None) -> tuple[str, str | None]:
    """The attacked layer's name (``layer`` if named, checked) and, when the ReLU's output goes
    straight into one linear layer and nowhere else, that layer's name.

    Raises
    ------
    LayerError
        When the input reaches something else first (a convolution, a normalisation...), the
        named layer is no nn.Linear that ``forward`` calls, or the layer's output goes anywhere
        but into a ReLU (a sigmoid, a second path...).
    torch.fx.proxy.TraceError
        When ``forward`` cannot be traced (control flow on values).
    """
    graph = fx.symbolic_trace(model).graph
    if layer is None:
        found = _first_reached(graph, model)
    else:
        calls = [n for n in graph.nodes if n.op == "call_module" and n.target == layer]
        if not calls or not isinstance(_module(calls[0], model), nn.Linear):
            raise LayerError(f"layer={layer!r}: forward calls no nn.Linear of that name")
        found = calls[0]
    name = str(found.target)
    users = list(found.users)
    wrong = [u for u in users if not _is_relu(u, model)]
    if wrong or not users:
        after = ", ".join(_what(u, model) for u in wrong) or "nothing"
        raise LayerError(
            f"the linear layer {name!r} is followed by {after}, not ReLU: SPEAR++ needs every "
            "use of its output to be a ReLU"
        )
    after_relu = [v for u in users for v in u.users]
    following = (
        str(after_relu[0].target)
        if len(after_relu) == 1 and isinstance(_module(after_relu[0], model), nn.Linear)
        else None
    )
    return name, following
