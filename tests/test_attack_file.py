"""``fl-sim attack UPDATE.npz`` on updates saved by a plain float32 PyTorch client outside fl-sim:
the reconstructions against the originals, which the attack never sees; and every bad file's
error."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from fl_sim.cli import main
from fl_sim.saved_update import UpdateFileError, read_update
from fl_sim.saved_update.update_file import parse_update
from tests.helpers import batch, sgd_steps

# Float32 training: the update (weight - weight_after) / lr carries the weights' round-off,
# about 1e-7 of a weight over lr; reconstructions within this share of the inputs' largest
# magnitude count as exact here (measured: see the tests' asserts and the report).
EXACT_RELATIVE = 1e-4


def _client_update(
    inputs: np.ndarray, labels: np.ndarray, width: int, lr: float, seed: int
) -> dict[str, np.ndarray]:
    """One SGD step of a plain float32 PyTorch client (Linear + ReLU first), saved the way a
    user would: the first layer before and after, and the learning rate."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(inputs.shape[1], width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 10),
    )
    first = model[0]
    sent = {
        "weight": first.weight.detach().numpy().copy(),
        "bias": first.bias.detach().numpy().copy(),
    }
    optimiser = torch.optim.SGD(model.parameters(), lr=lr)
    loss = nn.functional.cross_entropy(model(torch.from_numpy(inputs)), torch.from_numpy(labels))
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
    return {
        **sent,
        "weight_after": first.weight.detach().numpy().copy(),
        "bias_after": first.bias.detach().numpy().copy(),
        "lr": np.float32(lr),
    }


def _attack(
    update: dict[str, np.ndarray], tmp_path: Path
) -> tuple[np.ndarray, np.ndarray, dict[str, object]]:
    path = tmp_path / "update.npz"
    np.savez(path, **update)
    out = tmp_path / "out"
    assert main(["-q", "attack", str(path), "--out", str(out), "--device", "cpu"]) == 0
    with np.load(out / "reconstruction.npz") as rec:
        inputs, certified = rec["inputs"], rec["certified"]
    return inputs, certified, json.loads((out / "result.json").read_text())


def _worst_relative_error(rec: np.ndarray, originals: np.ndarray) -> float:
    """Per original, the max abs error of its nearest reconstruction; the worst, over the
    originals' largest magnitude."""
    x = torch.from_numpy(originals).double()
    r = torch.from_numpy(rec).double()
    nearest = torch.cdist(x, r).argmin(dim=1)
    assert len(set(nearest.tolist())) == len(x), "two originals share one reconstruction"
    return float((r[nearest] - x).abs().max() / x.abs().max())


def test_float32_client_b20_m200_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    b, n = 20, 3 * 32 * 32
    # Random images, normalised per channel the way a user's pipeline would.
    mean, std = np.array([0.5, 0.4, 0.3]), np.array([0.25, 0.2, 0.3])
    pixels = rng.random((b, 3, 32, 32))
    originals = (
        ((pixels - mean[:, None, None]) / std[:, None, None]).reshape(b, n).astype(np.float32)
    )
    labels = rng.integers(0, 10, b)
    update = _client_update(originals, labels, 200, 0.1, seed=0)
    update |= {"input_shape": np.array([3, 32, 32]), "mean": mean, "std": std}
    rec, certified, result = _attack(update, tmp_path)
    assert result["status"] == "exact"
    assert result["batch_size_estimated"] == b == rec.shape[0]
    assert result["certified"] == b and certified.all()
    assert rec.shape == (b, n)
    assert _worst_relative_error(rec, originals) < EXACT_RELATIVE
    inferred = result["inferred"]
    assert isinstance(inferred, dict) and inferred["rounding_noise"] > 0
    assert inferred["batch_size_method"] != "declared"
    grid = Image.open(tmp_path / "out" / "grid.png")
    assert grid.size == (b * 34 * 2, 34 * 2)


# 287 s on one thread of a busy machine (search 206 s, refinement 74 s): out of the default run.
@pytest.mark.slow
def test_float32_client_b100_m4000_cifar_exact(tmp_path: Path) -> None:
    _, x, y = batch(100, seed=3)
    originals = x.float().numpy()
    update = _client_update(originals, y.numpy(), 4000, 0.05, seed=1)
    start = time.perf_counter()
    rec, certified, result = _attack(update, tmp_path)
    seconds = time.perf_counter() - start
    error = _worst_relative_error(rec, originals)
    print(
        f"B=100 m=4000: {result['status']}, {result['certified']} certified, {seconds:.0f} s, "
        f"worst relative error {error:.2e}"
    )
    assert result["status"] == "exact" and certified.all() and rec.shape[0] == 100
    assert error < EXACT_RELATIVE


def _good() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "weight": rng.standard_normal((6, 12)),
        "bias": rng.standard_normal(6),
        "grad_weight": rng.standard_normal((6, 12)),
        "grad_bias": rng.standard_normal(6),
    }


def _without(*keys: str) -> dict[str, np.ndarray]:
    return {k: v for k, v in _good().items() if k not in keys}


def _after() -> dict[str, np.ndarray]:
    good = _good()
    return _without("grad_weight", "grad_bias") | {
        "weight_after": good["weight"] - 0.1 * good["grad_weight"],
        "bias_after": good["bias"] - 0.1 * good["grad_bias"],
        "lr": np.array(0.1),
    }


BAD_FILES = {
    "missing weight": (_without("weight"), "missing key 'weight': an (m, n) matrix expected"),
    "weight a vector": (_good() | {"weight": np.ones(6)}, "weight has shape (6,): an (m, n)"),
    "missing bias": (_without("bias"), "missing key 'bias': shape (6,)"),
    "bias misshapen": (_good() | {"bias": np.ones(5)}, "bias has shape (5,): (6,), one per row"),
    "grad_weight misshapen": (
        _good() | {"grad_weight": np.ones((6, 11))},
        "grad_weight has shape (6, 11): shape (6, 12), like weight expected",
    ),
    "missing grad_bias": (_without("grad_bias"), "missing key 'grad_bias': shape (6,), like bias"),
    "neither form": (_without("grad_weight", "grad_bias"), "the file has neither"),
    "both forms": (_after() | {"grad_weight": np.ones((6, 12))}, "the file has both"),
    "missing lr": (
        {k: v for k, v in _after().items() if k != "lr"},
        "missing key 'lr': a number > 0 (with weight_after, bias_after) expected",
    ),
    "lr zero": (_after() | {"lr": np.array(0.0)}, "lr=0.0: a number > 0 expected"),
    "weight_after misshapen": (
        _after() | {"weight_after": np.ones((12, 6))},
        "weight_after has shape (12, 6): shape (6, 12)",
    ),
    "unknown key": (_good() | {"weights": np.ones(1)}, "unknown keys ['weights']"),
    "text dtype": (_good() | {"bias": np.array(["a"] * 6)}, "bias has dtype <U1: real numbers"),
    "nan": (_good() | {"grad_bias": np.full(6, np.nan)}, "grad_bias holds 6 NaN or inf entries"),
    "steps fractional": (_good() | {"steps": np.array(1.5)}, "steps=1.5: an integer >= 1"),
    "batch_size zero": (_good() | {"batch_size": np.array(0)}, "batch_size=0.0: an integer >= 1"),
    "noise_std negative": (
        _good() | {"noise_std": np.array(-1.0)},
        "noise_std=-1.0: a number >= 0",
    ),
    "noise_std a vector": (_good() | {"noise_std": np.ones(2)}, "noise_std has shape (2,): one"),
    "next bias alone": (
        _good() | {"next_bias_grad": np.ones(3)},
        "missing key 'next_weight_grad': an (m, n) matrix",
    ),
    "next weight misshapen": (
        _good() | {"next_weight_grad": np.ones((3, 5)), "next_bias_grad": np.ones(3)},
        "next_weight_grad has shape (3, 5): (k, 6) expected",
    ),
    "next bias misshapen": (
        _good() | {"next_weight_grad": np.ones((3, 6)), "next_bias_grad": np.ones(4)},
        "next_bias_grad has shape (4,): (3,), one per row of next_weight_grad",
    ),
    "next weight alone": (
        _good() | {"next_weight": np.ones((3, 6))},
        "missing key 'next_weight_grad': an (m, n) matrix",
    ),
    "next weight misshapen as sent": (
        _good()
        | {
            "next_weight_grad": np.ones((3, 6)),
            "next_bias_grad": np.ones(3),
            "next_weight": np.ones((6, 3)),
        },
        "next_weight has shape (6, 3): shape (3, 6), like next_weight_grad expected",
    ),
    "input_shape wrong size": (
        _good() | {"input_shape": np.array([3, 2, 3])},
        "input_shape=[3, 2, 3] holds 18 values: 12 expected",
    ),
    "input_shape fractional": (
        _good() | {"input_shape": np.array([3, 4.5])},
        "input_shape=[3.0, 4.5]: a 1-d list of positive integers",
    ),
    "mean without input_shape": (
        _good() | {"mean": np.ones(3), "std": np.ones(3)},
        "mean needs input_shape",
    ),
    "mean per wrong channels": (
        _good() | {"input_shape": np.array([3, 2, 2]), "mean": np.ones(2), "std": np.ones(3)},
        "mean has shape (2,): (3,) expected, one per channel of input_shape=[3, 2, 2]",
    ),
    "std alone": (
        _good() | {"input_shape": np.array([3, 2, 2]), "std": np.ones(3)},
        "mean and std go together",
    ),
    "std zero": (
        _good() | {"input_shape": np.array([3, 2, 2]), "mean": np.ones(3), "std": np.zeros(3)},
        "std=[0.0, 0.0, 0.0]: every entry must be > 0",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_names_the_key(case: str, tmp_path: Path) -> None:
    arrays, message = BAD_FILES[case]
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(UpdateFileError) as err:
        read_update(path)
    assert message in str(err.value)


def test_not_an_npz_and_cli_exit(tmp_path: Path) -> None:
    path = tmp_path / "update.npz"
    path.write_text("gradients")
    with pytest.raises(UpdateFileError, match=r"not a numpy \.npz archive"):
        read_update(path)
    path.write_bytes(b"")
    with pytest.raises(SystemExit, match=r"update.npz: the file is empty, not a numpy \.npz"):
        main(["attack", str(path)])
    np.savez(path, **_without("weight"))
    with pytest.raises(SystemExit, match=r"fl-sim attack: .*update.npz: missing key 'weight'"):
        main(["attack", str(path)])


def test_good_files_parse() -> None:
    good = _good()
    direct = parse_update(good)
    np.testing.assert_array_equal(direct.grad_weight, good["grad_weight"])
    assert direct.rounding_noise == 0.0 and direct.noise_floor == 0.0
    after = parse_update(_after() | {"steps": np.array(4), "noise_std": np.array(0.3)})
    np.testing.assert_allclose(after.grad_weight, good["grad_weight"], rtol=1e-12, atol=1e-12)
    # Float64 weights round below the attack's tolerance: only the saved noise remains.
    assert after.noise_floor == pytest.approx(0.3) and after.steps == 4
    shaped = parse_update(
        good | {"input_shape": np.array([3, 2, 2]), "mean": np.array(0.5), "std": np.array(0.2)}
    )
    assert shaped.mean == (0.5, 0.5, 0.5) and shaped.input_shape == (3, 2, 2)


def test_next_weight_as_sent_reaches_an_uncentred_batch(tmp_path: Path) -> None:
    """Un-centred inputs (shared activation patterns) at B = m / 5: with the next layer's weight
    as sent the coupled search brings the batch back (the sign search alone found none of these
    40 samples in 47 s; see tests/test_coupled.py)."""
    b = 40
    x, sent, grads = sgd_steps(0, b, 300, 200, shift=2.0)
    update = {
        "weight": sent[0].numpy(),
        "bias": sent[1].numpy(),
        "grad_weight": grads[0].numpy(),
        "grad_bias": grads[1].numpy(),
        "next_weight_grad": grads[2].numpy(),
        "next_bias_grad": grads[3].numpy(),
        "next_weight": sent[2].numpy(),
    }
    inputs, certified, result = _attack(update, tmp_path)
    assert result["given"]["next_weight"] is True  # type: ignore[index]
    assert result["status"] == "exact" and int(certified.sum()) == b
    assert _worst_relative_error(inputs, x.numpy()) < 1e-6
