"""Every bad input gets a clear error that names the problem."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attacks import AttackInputError, SpearConfig, reconstruct
from attacks.spearpp.inputs import (
    FLOAT32_PRECISION,
    PRECISION_FLOOR,
    gradient_precision,
    observe_layer,
)

CHEAP = SpearConfig(starts=10, steps=5, max_passes=1)


def _layer(m: int = 30, n: int = 40, b: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, n, generator=g, dtype=torch.float64)
    w = torch.randn(m, n, generator=g, dtype=torch.float64)
    bias = torch.randn(m, generator=g, dtype=torch.float64)
    up = torch.randn(b, m, generator=g, dtype=torch.float64) * (x @ w.T + bias > 0)
    return {"grad_weight": up.T @ x, "grad_bias": up.sum(0), "weight": w, "bias": bias}


@pytest.mark.parametrize("key", ["grad_weight", "grad_bias", "weight", "bias"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_is_named(key: str, bad: float) -> None:
    layer = _layer()
    layer[key] = layer[key].clone()
    layer[key].view(-1)[0] = bad
    with pytest.raises(AttackInputError, match=f"{key} holds 1 NaN or infinite"):
        reconstruct(**layer, config=CHEAP)


@pytest.mark.parametrize(
    ("key", "shape"), [("grad_weight", (30, 41)), ("grad_bias", (29,)), ("bias", (31,))]
)
def test_shape_mismatch_is_named(key: str, shape: tuple[int, ...]) -> None:
    layer = _layer()
    layer[key] = torch.zeros(shape, dtype=torch.float64) + 1
    with pytest.raises(AttackInputError, match=f"{key} has shape"):
        reconstruct(**layer, config=CHEAP)


def test_weight_must_be_a_matrix() -> None:
    layer = _layer()
    layer["weight"] = layer["weight"].flatten()
    with pytest.raises(AttackInputError, match="weight must be 2-D"):
        reconstruct(**layer, config=CHEAP)


def test_all_zero_gradient() -> None:
    layer = _layer()
    layer["grad_weight"] = torch.zeros_like(layer["grad_weight"])
    with pytest.raises(AttackInputError, match="all zeros"):
        reconstruct(**layer, config=CHEAP)


def test_estimated_batch_size_at_width_is_refused() -> None:
    layer = _layer(m=10, n=40)
    # Full rank (B >= m) with a decaying spectrum, which no noise bulk has. (An i.i.d. Gaussian
    # matrix is indistinguishable from pure noise: nothing stands above it, tests/test_factor.py.)
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(40, 10, generator=g, dtype=torch.float64))
    layer["grad_weight"] = u * torch.logspace(0, -2, 10, dtype=torch.float64) @ v.T
    with pytest.raises(AttackInputError, match=r"B_hat=10 .* not below min\(m, n\) = 10"):
        reconstruct(**layer, config=CHEAP)


def test_float32_values_in_float64_arrays_get_float32_precision() -> None:
    """A float32 update widened to float64 (numpy's habit) carries float32 round-off: it gets the
    precision float32 tensors get; a genuine float64 gradient keeps float64's."""
    layer = _layer()
    widened = {k: v.float().double().numpy() for k, v in layer.items()}
    obs = observe_layer(**widened, device=torch.device("cpu"))
    as_float32 = observe_layer(**{k: v.float() for k, v in layer.items()}, device=obs.weight.device)
    assert obs.precision == as_float32.precision == FLOAT32_PRECISION
    assert obs.precision_from == "float32 values in a float64 array"
    assert as_float32.precision_from == "float32 dtype"
    exact = observe_layer(**layer, device=torch.device("cpu"))
    assert (exact.precision, exact.precision_from) == (PRECISION_FLOOR, "float64 dtype")
    assert gradient_precision(layer["grad_weight"] * 1.1)[0] == PRECISION_FLOOR


def test_declared_batch_size_out_of_range() -> None:
    with pytest.raises(AttackInputError, match="batch_size=30"):
        reconstruct(**_layer(), batch_size=30, config=CHEAP)


def test_integer_dtype_is_refused() -> None:
    layer = _layer()
    layer["weight"] = layer["weight"].to(torch.int64)
    with pytest.raises(AttackInputError, match=r"weight has dtype torch\.int64"):
        reconstruct(**layer, config=CHEAP)


def test_device_mix_is_refused() -> None:
    layer = _layer()
    layer["bias"] = layer["bias"].to("meta")
    with pytest.raises(AttackInputError, match="different devices"):
        reconstruct(**layer, config=CHEAP)


def test_not_an_array() -> None:
    layer: dict[str, object] = dict(_layer())
    layer["grad_bias"] = [1.0, 2.0]
    with pytest.raises(AttackInputError, match="grad_bias must be a torch tensor or a numpy"):
        reconstruct(**layer, config=CHEAP)  # type: ignore[arg-type]


def test_negative_noise_is_refused() -> None:
    with pytest.raises(AttackInputError, match="noise_std=-1"):
        reconstruct(**_layer(), noise_std=-1.0, config=CHEAP)


def test_numpy_inputs_are_accepted() -> None:
    layer = {k: v.numpy() for k, v in _layer().items()}
    rec = reconstruct(**layer, config=CHEAP)
    assert isinstance(rec.inputs, torch.Tensor) and rec.inputs.shape == (3, 40)
    assert isinstance(layer["weight"], np.ndarray)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("surrogate", "l2", "allowed are l1, logcosh, l4"),
        ("optimiser", "sgd", "allowed are radam, pgd"),
        ("starts", 0, "must be >= 1"),
        ("lr_final", 1.0, "lr_final=1.0: need 0 < lr_final <= lr"),
        ("device", "tpu", "allowed are auto, cpu, cuda, cuda:N"),
        ("search", "gauss", "allowed are signs, surrogate"),
        ("null_step", "svd", "allowed are auto, eigh, inverse"),
        ("sign_iterations", 0, "must be >= 1"),
        ("sign_patience", -1, "must be >= 0"),
    ],
)
def test_bad_config_is_named(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"SpearConfig.*{message}"):
        SpearConfig(**{field: value})  # type: ignore[arg-type]


def test_next_layer_must_take_this_layers_outputs() -> None:
    layer = _layer()
    m = layer["weight"].shape[0]
    with pytest.raises(AttackInputError, match=rf"must be k x {m}"):
        reconstruct(**layer, next_layer=(torch.ones(7, m + 1), torch.ones(7)), config=CHEAP)
    with pytest.raises(AttackInputError, match=r"next_grad_bias has shape \(6,\)"):
        reconstruct(**layer, next_layer=(torch.ones(7, m), torch.ones(6)), config=CHEAP)
    with pytest.raises(AttackInputError, match="next_grad_bias holds 1 NaN"):
        reconstruct(
            **layer, next_layer=(torch.ones(7, m), torch.tensor([np.nan] + [1.0] * 6)), config=CHEAP
        )
