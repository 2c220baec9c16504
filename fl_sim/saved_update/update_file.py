"""A client update saved to a ``.npz`` file anywhere (another framework, another run), read and
checked once into a typed, immutable view."""

from __future__ import annotations

import math
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fl_sim.audit.threat_model import rounding_noise
from strategies import update_as_gradient

# The first layer as the server sent it.
WEIGHT, BIAS = "weight", "bias"
# Either its gradient ...
GRAD_WEIGHT, GRAD_BIAS = "grad_weight", "grad_bias"
# ... or the layer after the client's local training, with the learning rate.
WEIGHT_AFTER, BIAS_AFTER, LR = "weight_after", "bias_after", "lr"
STEPS, BATCH_SIZE, NOISE_STD = "steps", "batch_size", "noise_std"
NEXT_WEIGHT_GRAD, NEXT_BIAS_GRAD = "next_weight_grad", "next_bias_grad"
# The next layer's weight as sent: with it the search couples each column to the next layer's
# output gradients (attacks.spearpp.coupled), which reaches batches the sign search alone does not.
NEXT_WEIGHT = "next_weight"
INPUT_SHAPE, MEAN, STD = "input_shape", "mean", "std"
KEYS = (
    WEIGHT,
    BIAS,
    GRAD_WEIGHT,
    GRAD_BIAS,
    WEIGHT_AFTER,
    BIAS_AFTER,
    LR,
    STEPS,
    BATCH_SIZE,
    NOISE_STD,
    NEXT_WEIGHT_GRAD,
    NEXT_BIAS_GRAD,
    NEXT_WEIGHT,
    INPUT_SHAPE,
    MEAN,
    STD,
)
# The next layer's weight and bias gradients, and its weight as sent where saved.
NextLayerArrays = tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, np.ndarray]


class UpdateFileError(ValueError):
    """The file cannot be read as an update; the message names the key, what it holds and what
    is expected."""


@dataclass(frozen=True)
class SavedUpdate:
    """One client's update of a linear layer followed by ReLU, as the attack takes it.

    Attributes
    ----------
    weight, bias
        The layer as the server sent it (m x n, m), float64.
    grad_weight, grad_bias
        Its gradient (m x n, m), float64: as saved, or (weight - weight_after) / lr.
    gradient_from
        How the gradient was obtained, in words.
    rounding_noise
        Per-entry std of the round-off that (weight - weight_after) / lr carries when the
        weights were saved in float32 (0 for a saved gradient or float64 weights): the noise
        floor the attack's zero tolerances follow.
    steps
        Local steps behind the update (1 unless saved); each step rounds the weights again.
    batch_size
        The batch size, if saved (the attack estimates it otherwise).
    noise_std
        Per-entry std of noise added to the gradient (e.g. DP-SGD's sigma * C / batch size), if
        saved.
    next_layer
        The next linear layer's weight (k x m) and bias (k) gradients, and its weight as sent
        (k x m) where saved, if saved (one-step updates only).
    input_shape
        The shape of one input (its product n), if saved: C x H x W images get a grid.
    mean, std
        The per-channel normalisation the inputs went through, if saved, to undo it in the grid.
    """

    weight: np.ndarray
    bias: np.ndarray
    grad_weight: np.ndarray
    grad_bias: np.ndarray
    gradient_from: str
    rounding_noise: float = 0.0
    steps: int = 1
    batch_size: int | None = None
    noise_std: float | None = None
    next_layer: NextLayerArrays | None = None
    input_shape: tuple[int, ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def width(self) -> int:
        """m, the layer's neurons."""
        return int(self.weight.shape[0])

    @property
    def input_dim(self) -> int:
        """n, the dimension of the layer's input."""
        return int(self.weight.shape[1])

    @property
    def noise_floor(self) -> float:
        """Per-entry std of all known noise: the saved noise and the rounding of ``steps``
        float32 steps, independent, together."""
        return math.hypot(self.noise_std or 0.0, self.rounding_noise * math.sqrt(self.steps))


def read_update(path: Path) -> SavedUpdate:
    """Read and check the update saved at ``path``.

    Raises
    ------
    UpdateFileError
        When the file is no ``.npz``, or a key is missing, unknown, misshapen or of a bad value.
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except FileNotFoundError:
        raise UpdateFileError(f"{path}: no such file") from None
    except EOFError:  # what numpy raises on a file of no bytes
        raise UpdateFileError(f"{path}: the file is empty, not a numpy .npz archive") from None
    except (zipfile.BadZipFile, ValueError, OSError) as err:
        raise UpdateFileError(f"{path}: not a numpy .npz archive ({err})") from None
    return parse_update(arrays)


def parse_update(arrays: Mapping[str, np.ndarray]) -> SavedUpdate:
    """Check the arrays of a saved update (keys as in :data:`KEYS`) and build its view.

    Raises
    ------
    UpdateFileError
        When a key is missing, unknown, misshapen or of a bad value.
    """
    unknown = sorted(set(arrays) - set(KEYS))
    if unknown:
        raise UpdateFileError(f"unknown keys {unknown}: the keys allowed are {list(KEYS)}")
    weight = _matrix(arrays, WEIGHT, None)
    m, n = weight.shape
    bias = _vector(arrays, BIAS, m, f"({m},), one per row of {WEIGHT} {weight.shape}")
    has_grad = GRAD_WEIGHT in arrays or GRAD_BIAS in arrays
    has_after = WEIGHT_AFTER in arrays or BIAS_AFTER in arrays
    if has_grad == has_after:
        raise UpdateFileError(
            f"the update needs either {GRAD_WEIGHT} and {GRAD_BIAS}, or {WEIGHT_AFTER} and "
            f"{BIAS_AFTER} with {LR}; the file has " + ("both" if has_grad else "neither")
        )
    rounding = 0.0
    if has_grad:
        grad_weight = _matrix(arrays, GRAD_WEIGHT, (m, n))
        grad_bias = _vector(arrays, GRAD_BIAS, m, f"({m},), like {BIAS}")
        source = f"{GRAD_WEIGHT}, {GRAD_BIAS} as saved"
    else:
        after_weight = _matrix(arrays, WEIGHT_AFTER, (m, n))
        after_bias = _vector(arrays, BIAS_AFTER, m, f"({m},), like {BIAS}")
        lr = _positive(arrays, LR, f"with {WEIGHT_AFTER}, {BIAS_AFTER}")
        grad_weight = update_as_gradient(weight, after_weight, lr)
        grad_bias = update_as_gradient(bias, after_bias, lr)
        # The weights after training were rounded to the dtype they were saved in.
        rounding = rounding_noise(arrays[WEIGHT_AFTER], lr)
        source = f"({WEIGHT} - {WEIGHT_AFTER}) / {LR} with {LR}={lr:g}"
    steps = _count(arrays, STEPS) or 1
    next_layer: NextLayerArrays | None = None
    if NEXT_WEIGHT_GRAD in arrays or NEXT_BIAS_GRAD in arrays or NEXT_WEIGHT in arrays:
        next_weight = _matrix(arrays, NEXT_WEIGHT_GRAD, None)
        if next_weight.shape[1] != m:
            raise UpdateFileError(
                f"{NEXT_WEIGHT_GRAD} has shape {next_weight.shape}: (k, {m}) expected, one "
                f"column per neuron of {WEIGHT} {weight.shape}"
            )
        k = next_weight.shape[0]
        next_bias = _vector(arrays, NEXT_BIAS_GRAD, k, f"({k},), one per row of {NEXT_WEIGHT_GRAD}")
        next_layer = (next_weight, next_bias)
        if NEXT_WEIGHT in arrays:
            sent = _matrix(arrays, NEXT_WEIGHT, next_weight.shape, NEXT_WEIGHT_GRAD)
            next_layer = (next_weight, next_bias, sent)
    input_shape = _input_shape(arrays, n)
    mean = _per_channel(arrays, MEAN, input_shape)
    std = _per_channel(arrays, STD, input_shape)
    if (mean is None) != (std is None):
        raise UpdateFileError(f"{MEAN} and {STD} go together: the file has only one of them")
    if std is not None and not all(s > 0 for s in std):
        raise UpdateFileError(f"{STD}={list(std)}: every entry must be > 0")
    noise = arrays.get(NOISE_STD)
    return SavedUpdate(
        weight=weight,
        bias=bias,
        grad_weight=grad_weight,
        grad_bias=grad_bias,
        gradient_from=source,
        rounding_noise=rounding,
        steps=steps,
        batch_size=_count(arrays, BATCH_SIZE),
        noise_std=None if noise is None else _non_negative(arrays, NOISE_STD),
        next_layer=next_layer,
        input_shape=input_shape,
        mean=mean,
        std=std,
    )


def _get(arrays: Mapping[str, np.ndarray], key: str, expected: str) -> np.ndarray:
    if key not in arrays:
        raise UpdateFileError(f"missing key {key!r}: {expected} expected")
    value = np.asarray(arrays[key])
    if not np.issubdtype(value.dtype, np.number) or np.issubdtype(value.dtype, np.complexfloating):
        raise UpdateFileError(f"{key} has dtype {value.dtype}: real numbers are expected")
    if not np.isfinite(value).all():
        raise UpdateFileError(f"{key} holds {int((~np.isfinite(value)).sum())} NaN or inf entries")
    return value


def _matrix(
    arrays: Mapping[str, np.ndarray],
    key: str,
    shape: tuple[int, ...] | None,
    like: str = WEIGHT,
) -> np.ndarray:
    expected = "an (m, n) matrix" if shape is None else f"shape {shape}, like {like}"
    value = _get(arrays, key, expected)
    if value.ndim != 2 or (shape is not None and value.shape != shape):
        raise UpdateFileError(f"{key} has shape {value.shape}: {expected} expected")
    # Float32 values are kept as they are in float64: the attack reads their precision off them.
    return value.astype(np.float64)


def _vector(arrays: Mapping[str, np.ndarray], key: str, size: int, expected: str) -> np.ndarray:
    value = _get(arrays, key, f"shape {expected}")
    if value.shape != (size,):
        raise UpdateFileError(f"{key} has shape {value.shape}: {expected} expected")
    return value.astype(np.float64)


def _scalar(arrays: Mapping[str, np.ndarray], key: str, expected: str) -> float:
    value = _get(arrays, key, expected)
    if value.size != 1:
        raise UpdateFileError(f"{key} has shape {value.shape}: one number expected")
    return float(value.reshape(()))


def _positive(arrays: Mapping[str, np.ndarray], key: str, why: str) -> float:
    value = _scalar(arrays, key, f"a number > 0 ({why})")
    if not value > 0:
        raise UpdateFileError(f"{key}={value!r}: a number > 0 expected")
    return value


def _non_negative(arrays: Mapping[str, np.ndarray], key: str) -> float:
    value = _scalar(arrays, key, "a number >= 0")
    if not value >= 0:
        raise UpdateFileError(f"{key}={value!r}: a number >= 0 expected")
    return value


def _count(arrays: Mapping[str, np.ndarray], key: str) -> int | None:
    if key not in arrays:
        return None
    value = _scalar(arrays, key, "an integer >= 1")
    if not (value >= 1 and value == int(value)):
        raise UpdateFileError(f"{key}={value!r}: an integer >= 1 expected")
    return int(value)


def _input_shape(arrays: Mapping[str, np.ndarray], n: int) -> tuple[int, ...] | None:
    if INPUT_SHAPE not in arrays:
        return None
    value = _get(arrays, INPUT_SHAPE, "")
    shape = tuple(int(d) for d in value.reshape(-1))
    if (
        value.ndim != 1
        or not shape
        or any(d < 1 or d != v for d, v in zip(shape, value, strict=True))
    ):
        raise UpdateFileError(
            f"{INPUT_SHAPE}={value.tolist()}: a 1-d list of positive integers expected, e.g. "
            "[3, 32, 32]"
        )
    if math.prod(shape) != n:
        raise UpdateFileError(
            f"{INPUT_SHAPE}={list(shape)} holds {math.prod(shape)} values: {n} expected, the "
            f"columns of {WEIGHT}"
        )
    return shape


def _per_channel(
    arrays: Mapping[str, np.ndarray], key: str, input_shape: tuple[int, ...] | None
) -> tuple[float, ...] | None:
    if key not in arrays:
        return None
    if input_shape is None:
        raise UpdateFileError(f"{key} needs {INPUT_SHAPE}, to know the channels it applies to")
    value = _get(arrays, key, "")
    channels = input_shape[0]
    if value.shape not in ((channels,), ()):
        raise UpdateFileError(
            f"{key} has shape {value.shape}: ({channels},) expected, one per channel of "
            f"{INPUT_SHAPE}={list(input_shape)} (or one number for all)"
        )
    return tuple(float(v) for v in np.broadcast_to(value, (channels,)))
