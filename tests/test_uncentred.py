"""Inputs as users feed them: [0, 1] pixels straight from ``ToTensor()``, no ``Normalize``, into
a plain PyTorch MLP at its default initialisation. The mean image dominates every
pre-activation, so many neurons are silent for the whole batch (their gradient rows exactly
zero) and many fire for all of it; the batch must still come back whole and certified, on
float64 and float32 clients, over several seeds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attacks import SpearConfig, reconstruct
from attacks.spearpp.inputs import observe_layer
from attacks.spearpp.rounds import few_zero_rows
from fl_sim.audit.metrics import EXACT_DB, judge_certificates, match_and_score
from fl_sim.bench.attack import run_case
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.certificates import attack_one, grid
from fl_sim.data.normalize import Normalization
from tests.helpers import batch, real_images


def _plain_mlp(width: int) -> nn.Sequential:
    """An MLP as people write it: PyTorch's default initialisation, two hidden layers."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3072, width), nn.ReLU(), nn.Linear(width, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )  # fmt: skip


def _unit_gradient(
    b: int, width: int, seed: int, dtype: torch.dtype
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A FedSGD gradient of ``b`` real images on [0, 1] and those images (b x 3072, float64)."""
    pixels, _, labels = batch(b, seed)
    torch.manual_seed(seed)
    net = _plain_mlp(width).to(dtype)
    loss = nn.functional.cross_entropy(net(pixels.to(dtype)), labels)
    layer = net[1]
    gw, gb = torch.autograd.grad(loss, [layer.weight, layer.bias])
    view = {"grad_weight": gw, "grad_bias": gb, "weight": layer.weight, "bias": layer.bias}
    return {k: v.detach() for k, v in view.items()}, pixels.flatten(1)


def test_silent_neurons_are_read_off_the_gradient() -> None:
    view, x = _unit_gradient(10, 256, 0, torch.float64)
    silent = observe_layer(**view, device=torch.device("cpu")).silent
    inactive_for_all = ((x @ view["weight"].T + view["bias"]) <= 0).all(dim=0)
    assert torch.equal(silent, inactive_for_all) and 0 < int(silent.sum()) < 256


@pytest.mark.parametrize(
    ("b", "width", "dtype"),
    [(20, 256, torch.float64), (50, 1000, torch.float64), (20, 256, torch.float32)],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unit_pixels_come_back_whole(b: int, width: int, seed: int, dtype: torch.dtype) -> None:
    view, x = _unit_gradient(b, width, seed, dtype)
    rec = reconstruct(**view, batch_size=b)
    assert rec.settings["silent_neurons"] > 0
    quality = match_and_score(rec.inputs, x)
    assert bool((quality.psnr >= EXACT_DB).all()), (rec.status, rec.reason, quality.psnr.min())
    judged = judge_certificates(rec.inputs, x, rec.certified)
    assert judged["certified_not_exact"] == 0, judged


@pytest.mark.parametrize("seed", [1, 2])
def test_a_multi_step_update_with_silent_neurons_still_comes_back(seed: int) -> None:
    """Three epochs of FedAvg on a small layer (n=20 un-centred features, m=80, B=12): its
    columns have few zeros besides the silent neurons', and a search on the live rows alone
    found 1 of 12."""
    row = next(r for r in grid() if r.name == "n=20 m=80 depth=2 C=3 B=12 float64 fedavg")
    result = attack_one(row, seed, SpearConfig(time_budget_s=60.0))
    assert result["exact"] == 12 and result["certified_not_exact"] == 0, result


def test_fewer_rows_stay_off_every_row_without_noise() -> None:
    """Float64 gradients of the same small layer (3 classes), the certificates' row of 20
    seeds: few_zero_rows counts the live neurons' zeros, and taken on every row too (the
    silent ones included) its rows verified mixes, 1 of the row's 240 samples exact. Which
    batch comes back whole is a matter of where the random starts land (seed 12 with starts
    uniform in the search's coordinates, 1 and 15 with half of them in the engine's), so the
    row is counted: 25 samples exact, 24 certified."""
    row = next(r for r in grid() if r.name == "n=20 m=80 depth=2 C=3 B=12 float64 fedsgd")
    results = [attack_one(row, seed, SpearConfig(time_budget_s=60.0)) for seed in range(20)]
    assert sum(r["exact"] for r in results) >= 12, [r["exact"] for r in results]
    assert sum(r["certified_not_exact"] for r in results) == 0


@pytest.mark.parametrize("seed", [1, 11])
def test_fewer_rows_on_every_row_under_float32_round_off(seed: int) -> None:
    """A float32 update of the same layer (10 classes): the first try on every row finds this
    batch's columns on the fewer rows only (with the default: none, the batch not certified)."""
    row = next(r for r in grid() if r.name == "n=20 m=80 depth=2 C=10 B=12 float32 fedsgd")
    result = attack_one(row, seed, SpearConfig(time_budget_s=60.0))
    assert result["certified"] == 12 and result["certified_not_near_exact"] == 0, result


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pixels_whose_samples_leave_few_neurons_inactive(seed: int) -> None:
    """[0, 1] pixels as ``ToTensor()`` gives them, B=20, m=200, the project's depth-6 network:
    57 of the 155 live neurons fire for every sample of seed 1's batch, and its samples leave
    only 45 to 58 inactive, fewer than the default null step's 60 rows, so no true column was
    a fixed point there and the search stopped at 4 of 20 columns."""
    case = AttackCase("uncentred", 20, 200, centred=False)
    row = run_case(case, seed, real_images(), Normalization(), torch.float64)
    if seed == 1:  # the batch above: the default rows do not fit its samples' zeros
        assert row["attack"]["settings"]["few_zero_rows"] is not None
    assert row["attack"]["status"] == "exact", row["attack"]["reason"]
    assert row["share_exact"] == 1.0 and row["certified_not_exact"] == 0


def test_the_default_rows_are_kept_where_they_fit_a_samples_zeros() -> None:
    # Counts measured on [0, 1] pixels at depth 6 (live and silent neurons of the batch).
    assert few_zero_rows(155, 20, 45) == 33  # m=200, B=20: 60 default rows, 55 zeros estimated
    assert few_zero_rows(906, 125, 94) is None  # m=1000, B=125: 375 rows, 406 estimated
    assert few_zero_rows(600, 32, 560) == 31  # a sparse layer: at least a null direction


@pytest.mark.parametrize("seed", [0, 1])
def test_coupled_points_run_in_float64_where_neurons_are_silent(seed: int) -> None:
    """[0, 1] pixels leave silent neurons, and there the coupled search runs in float64 (in
    float32 its points missed: B=125, m=1000, 43 of 125 exact in 300 s against 125 in 28 s);
    the same images centred keep the config's float32. Both batches come back whole."""
    pixels, _, labels = batch(30, seed)
    for centred, dtype in ((False, "float64"), (True, "float32")):
        torch.manual_seed(seed)
        net = _plain_mlp(256).double()
        x = pixels.double() * 2 - 1 if centred else pixels.double()
        loss = nn.functional.cross_entropy(net(x), labels)
        first, second = net[1], net[3]
        gw, gb, nw, nb = torch.autograd.grad(
            loss, [first.weight, first.bias, second.weight, second.bias]
        )
        rec = reconstruct(
            gw, gb, first.weight.detach(), first.bias.detach(), batch_size=30,
            next_layer=(nw, nb, second.weight.detach()),
        )  # fmt: skip
        assert rec.settings["coupled_dtype"] == dtype, centred
        assert bool(rec.settings["silent_neurons"]) is not centred
        quality = match_and_score(rec.inputs, x.flatten(1))
        assert bool((quality.psnr >= EXACT_DB).all()), (centred, rec.status, rec.reason)
