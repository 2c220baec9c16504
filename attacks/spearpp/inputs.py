"""Checking and converting what the server hands to the engine."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Annotated

import numpy as np
import torch
from pydantic import AfterValidator

from attacks.errors import AttackInputError

ArrayLike = torch.Tensor | np.ndarray
# The next layer's weight and bias gradients, and optionally its weight as sent.
NextArrays = tuple[ArrayLike, ArrayLike] | tuple[ArrayLike, ArrayLike, ArrayLike]
# Relative size under which float64 entries of a rank-B product are round-off (measured residue
# about 1e-14; real entries sit far above 1e-9).
PRECISION_FLOOR = 1e-9
# Float32 round-off relative to an entry, as every zero tolerance's floor.
FLOAT32_PRECISION = 100 * torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class NextLayer:
    """The gradient of the linear layer that takes the attacked layer's ReLU output, as float64
    tensors: only valid for a single-step update (one batch gradient, noisy or not).

    Attributes
    ----------
    grad_weight
        k x m, the sum over samples of the layer's output gradient times the sample's hidden
        vector relu(W x_i + b).
    grad_bias
        k, the sum of the output gradients.
    weight
        k x m, the layer's weight as the server sent it, where given: it ties each sample's
        output gradient here to its column of the attacked layer (see
        :mod:`attacks.spearpp.coupled`).
    """

    grad_weight: torch.Tensor
    grad_bias: torch.Tensor
    weight: torch.Tensor | None = None


@dataclass(frozen=True)
class LayerObservation:
    """What the server observed of one fully connected layer, as float64 tensors on one device.

    Attributes
    ----------
    grad_weight
        Gradient (or update turned into one) of the layer's weight, m x n.
    grad_bias
        Gradient of the layer's bias, m.
    weight, bias
        The layer's weight (m x n) and bias (m) as the server sent them.
    precision
        Relative round-off of the gradient as it arrived (float32 gradients carry ~1e-7 noise
        that float64 arithmetic here cannot remove): the floor of every zero tolerance.
    next_layer
        The next linear layer's gradient, when the server has it and the update is one step:
        it pins each sample's scale far better than the bias gradient alone under noise.
    precision_from
        Where ``precision`` came from: the gradient's dtype, or float32 values found in a
        float64 gradient (a float32 client's update as numpy code hands it over).
    """

    grad_weight: torch.Tensor
    grad_bias: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    precision: float
    next_layer: NextLayer | None = None
    precision_from: str = "float64 dtype"

    @property
    def width(self) -> int:
        """m, the number of neurons of the layer."""
        return int(self.weight.shape[0])

    @property
    def input_dim(self) -> int:
        """n, the dimension of the layer's input."""
        return int(self.weight.shape[1])

    @cached_property
    def silent(self) -> torch.Tensor:
        """Per neuron, whether its gradient is exactly zero (weight row and bias): no sample of
        the batch activated it (or none passed a gradient through it), so its row says only
        that, for every sample alike.

        Such rows vanish for every direction and give a null step nothing to pin: the sign
        search runs first without them (see ``stages.search_signs``).
        """
        silent: torch.Tensor = ~self.grad_weight.any(dim=1) & (self.grad_bias == 0)
        return silent

    @cached_property
    def bias_share(self) -> float:
        """The biases' size next to the weights' share of the pre-activations, rms(b) /
        rms(W x), estimated from the update alone: each neuron's gradient row is its samples'
        inputs summed with the weights its bias gradient sums, so |dW_j| / |db_j| (the median
        over neurons) stands for |x|, and a weight row meets an input at about |w_j| |x| /
        sqrt(n).

        Measured, estimate (truth): CIFAR-10 images centred 0.013 (0.018), on [0, 1] 0.029
        (0.033); breast-cancer records (30 features) standardised 0.20 (0.19), min-max 0.97
        (0.64). Small inputs meet weights of PyTorch's 1 / sqrt(n) scale at sizes near the
        biases'.
        """
        some = self.grad_bias != 0
        if not bool(some.any()):
            return 0.0
        size = (self.grad_weight[some].norm(dim=1) / self.grad_bias[some].abs()).median()
        rows = self.weight.norm(dim=1).square().mean().sqrt()
        return float(self.bias.square().mean().sqrt() * self.input_dim**0.5 / (rows * size))


def _device_name(device: str) -> str:
    if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
        raise ValueError("allowed are auto, cpu, cuda, cuda:N")
    return device


# A device setting, checked where settings are validated (``cuda:N``: the N-th GPU).
Device = Annotated[str, AfterValidator(_device_name)]


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else the CPU; other names are taken as given."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise AttackInputError(f"device={name!r} was asked for, but CUDA is not available here")
    return device


def _as_tensor(name: str, value: object) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise AttackInputError(
            f"{name} must be a torch tensor or a numpy array, got {type(value).__name__}"
        )
    if not (value.dtype.is_floating_point and not value.dtype.is_complex):
        raise AttackInputError(f"{name} has dtype {value.dtype}: a real floating dtype is needed")
    return value


def _check_finite(name: str, value: torch.Tensor) -> None:
    if not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        raise AttackInputError(f"{name} holds {bad} NaN or infinite entries")


def observe_layer(
    grad_weight: ArrayLike,
    grad_bias: ArrayLike,
    weight: ArrayLike,
    bias: ArrayLike,
    device: torch.device,
    next_layer: NextArrays | None = None,
) -> LayerObservation:
    """Validate the four arrays (and the next layer's weight and bias gradients, and its weight,
    if given) and move them to ``device`` as float64.

    Raises
    ------
    AttackInputError
        For a non-array, a non-float dtype, NaN or inf, tensors on different devices, shapes that
        do not fit one m x n layer (and a k x m next layer), or an all-zero gradient.
    """
    named = {
        "grad_weight": _as_tensor("grad_weight", grad_weight),
        "grad_bias": _as_tensor("grad_bias", grad_bias),
        "weight": _as_tensor("weight", weight),
        "bias": _as_tensor("bias", bias),
    }
    if next_layer is not None:
        named["next_grad_weight"] = _as_tensor("next_grad_weight", next_layer[0])
        named["next_grad_bias"] = _as_tensor("next_grad_bias", next_layer[1])
        if len(next_layer) > 2:
            named["next_weight"] = _as_tensor("next_weight", next_layer[2])
    devices = {str(t.device) for t in named.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {t.device}" for k, t in named.items())
        raise AttackInputError(f"inputs live on different devices ({where}): put them on one")
    for key, tensor in named.items():
        _check_finite(key, tensor)
    w, gw = named["weight"], named["grad_weight"]
    if w.ndim != 2:
        raise AttackInputError(f"weight must be 2-D (m x n), got shape {tuple(w.shape)}")
    m, n = w.shape
    expected = {"grad_weight": (m, n), "grad_bias": (m,), "bias": (m,)}
    if next_layer is not None:
        nw = named["next_grad_weight"]
        if nw.ndim != 2 or nw.shape[1] != m:
            raise AttackInputError(
                f"next_grad_weight has shape {tuple(nw.shape)}, but the next layer takes the "
                f"{m} outputs of this one, so it must be k x {m}"
            )
        expected["next_grad_bias"] = (nw.shape[0],)
        if "next_weight" in named:
            expected["next_weight"] = tuple(nw.shape)
    for key, shape in expected.items():
        if tuple(named[key].shape) != shape:
            raise AttackInputError(
                f"{key} has shape {tuple(named[key].shape)}, but weight is {m} x {n}, "
                f"so {key} must have shape {shape}"
            )
    if not bool(gw.any()):
        raise AttackInputError("grad_weight is all zeros: there is nothing to reconstruct from")
    moved = {k: t.to(device=device, dtype=torch.float64) for k, t in named.items()}
    precision, precision_from = gradient_precision(gw)
    nxt = None
    if next_layer is not None:
        nxt = NextLayer(
            moved.pop("next_grad_weight"),
            moved.pop("next_grad_bias"),
            moved.pop("next_weight", None),
        )
    return LayerObservation(
        **moved, precision=precision, next_layer=nxt, precision_from=precision_from
    )


def gradient_precision(grad_weight: torch.Tensor) -> tuple[float, str]:
    """The relative round-off a gradient carries, and where it was read from.

    A float64 array every entry of which is a float32 number (``x == float64(float32(x))``) is a
    float32 gradient widened, as numpy code does: it carries float32 round-off, which float64
    arithmetic cannot remove, so it gets float32's floor as float32 tensors do.
    """
    dtype = grad_weight.dtype
    name = str(dtype).removeprefix("torch.")
    if dtype == torch.float64 and bool(
        (grad_weight == grad_weight.to(torch.float32).to(torch.float64)).all()
    ):
        return max(PRECISION_FLOOR, FLOAT32_PRECISION), "float32 values in a float64 array"
    return max(PRECISION_FLOOR, 100 * torch.finfo(dtype).eps), f"{name} dtype"
