"""Batch size from the gradient's rank: exact products, float32 round-off, DP noise declared or
fitted to the spectrum's noise bulk."""

from __future__ import annotations

import math

import pytest
import torch

from attacks.errors import AttackInputError
from attacks.spearpp.factor import (
    NOISE_EDGE_FACTOR,
    Factorisation,
    factorise,
    fit_bulk,
    mp_median,
)
from attacks.spearpp.inputs import FLOAT32_PRECISION
from tests.helpers import observation


def _gradient(b: int, m: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    up = torch.randn(b, m, generator=g, dtype=torch.float64)
    up = up * (torch.rand(b, m, generator=g) > 0.5)
    return up.T @ torch.randn(b, n, generator=g, dtype=torch.float64)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(1)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("b", [1, 7, 40, 130])
def test_float_rank_finds_batch_size(b: int, seed: int) -> None:
    gw = _gradient(b, 300, 500, seed)
    fac = factorise(gw, batch_size=None, noise_std=None, precision=1e-9, generator=_gen())
    assert (fac.batch_size, fac.method) == (b, "float-rank")
    assert torch.allclose(fac.left.T @ fac.left, torch.eye(b, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(fac.left @ fac.right, gw, atol=1e-10 * gw.abs().max())


@pytest.mark.parametrize("seed", range(3))
def test_float64_round_off_past_a_large_batch_is_no_noise(seed: int) -> None:
    """B beyond the first probes' reach, singular values falling steadily (a trained network's
    weak samples): the bulk fitted to the first probes held samples, and the round-off past B
    is not undeclared noise (it sent the search down its noisy path)."""
    g = torch.Generator().manual_seed(seed)
    b, m, n = 150, 1000, 1200
    left = torch.linalg.qr(torch.randn(m, b, generator=g, dtype=torch.float64)).Q
    right = torch.linalg.qr(torch.randn(n, b, generator=g, dtype=torch.float64)).Q
    values = torch.logspace(0, -6, b, dtype=torch.float64)
    gw = (left * values) @ right.T
    fac = factorise(gw, batch_size=None, noise_std=None, precision=1e-9, generator=_gen())
    assert (fac.batch_size, fac.method) == (b, "float-rank")
    assert fac.noise_std == 0.0
    assert not fac.undeclared_noise


@pytest.mark.parametrize("seed", range(3))
def test_randomised_factor_matches_full_svd(seed: int) -> None:
    gw = _gradient(25, 400, 600, seed)
    fast = factorise(gw, batch_size=None, noise_std=None, precision=1e-9, generator=_gen())
    s_full = torch.linalg.svdvals(gw)[:25]
    assert torch.allclose(fast.singular_values[:25], s_full, rtol=1e-10)


def test_float32_gradient_uses_its_precision() -> None:
    gw = _gradient(20, 200, 300, 0).float().double()
    fac = factorise(gw, batch_size=None, noise_std=None, precision=1.2e-5, generator=_gen())
    assert fac.batch_size == 20


@pytest.mark.parametrize("seed", range(3))
def test_float32_weak_samples_count_and_the_round_off_is_measured(seed: int) -> None:
    """A float32 gradient whose weakest samples (a trained network's well-classified ones)
    sit below 100 float32 epsilons of s_1 but far above the round-off's own bulk: they count,
    and the round-off's level is read off the tail (it sets the zero tolerances)."""
    b, m, n = 20, 200, 3072
    gen = torch.Generator().manual_seed(seed)
    strength = torch.logspace(0, -3, b - 2, dtype=torch.float64)
    strength = torch.cat([strength, torch.tensor([4e-6, 2e-6], dtype=torch.float64)])
    up = torch.randn(b, m, generator=gen, dtype=torch.float64) * strength[:, None]
    up = up * (torch.rand(b, m, generator=gen) > 0.5)
    x = torch.randn(b, n, generator=gen, dtype=torch.float64)
    exact = up.T @ x
    gw = (up.float().T @ x.float()).double()  # the float32 client's round-off
    fac = factorise(
        gw, batch_size=None, noise_std=None, precision=FLOAT32_PRECISION, generator=_gen()
    )
    assert (fac.batch_size, fac.method) == (b, "float-rank")
    assert fac.noise_std == 0.0 and not fac.undeclared_noise
    # The bulk's std against the round-off actually in the gradient (it is not i.i.d.: what
    # matters is its order of magnitude).
    actual = float((gw - exact).std())
    assert 0.2 * actual < fac.roundoff_std < 5 * actual
    assert "float32 round-off" in fac.note
    float64 = factorise(exact, batch_size=None, noise_std=None, precision=1e-9, generator=_gen())
    assert float64.roundoff_std == 0.0 and float64.batch_size == b


@pytest.mark.parametrize("seed", range(3))
def test_declared_noise_sets_the_edge(seed: int) -> None:
    m, n, b = 200, 600, 20
    gw = _gradient(b, m, n, seed)
    std = 1e-3 * float(gw.std())
    noisy = gw + std * torch.randn(m, n, generator=torch.Generator().manual_seed(9), dtype=gw.dtype)
    fac = factorise(noisy, batch_size=None, noise_std=std, precision=1e-9, generator=_gen())
    assert (fac.batch_size, fac.method) == (b, "noise-edge")


def _noisy(b: int, m: int, n: int, seed: int, level: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank-b gradient plus i.i.d. Gaussian noise of ``level`` times its entries' std; the
    noisy gradient and the noise itself."""
    gw = _gradient(b, m, n, seed)
    gen = torch.Generator().manual_seed(100 + seed)
    noise = level * float(gw.std()) * torch.randn(m, n, generator=gen, dtype=gw.dtype)
    return gw + noise, noise


def _blind(gw: torch.Tensor, noise_std: float | None = None) -> Factorisation:
    return factorise(gw, batch_size=None, noise_std=noise_std, precision=1e-9, generator=_gen())


def _reference_rank(gw: torch.Tensor, std: float) -> int:
    """Brute force: the full SVD's singular values above the edge of the true noise level."""
    m, n = gw.shape
    edge = NOISE_EDGE_FACTOR * std * (math.sqrt(m) + math.sqrt(n))
    return int((torch.linalg.svdvals(gw) > edge).sum())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("b", "m", "n", "level"),
    [(20, 200, 3072, 1e-3), (40, 300, 500, 1e-2), (7, 500, 300, 1e-3), (60, 400, 800, 3e-3)],
)
def test_undeclared_noise_is_fitted_to_the_bulk(
    b: int, m: int, n: int, level: float, seed: int
) -> None:
    noisy, noise = _noisy(b, m, n, seed, level)
    fac = _blind(noisy)
    true_std = float(noise.std())
    assert (
        (fac.batch_size, fac.method)
        == (b, "noise-bulk")
        == (_reference_rank(noisy, true_std), "noise-bulk")
    )
    assert fac.noise_estimated is not None
    assert abs(fac.noise_estimated / true_std - 1) < 0.1
    assert fac.noise_std == fac.noise_estimated and fac.noise_declared is None
    assert fac.undeclared_noise and "undeclared noise" in fac.note
    assert fac.confidence == 1.0 and fac.spectrum["weakest_over_edge"] > 10
    assert 0.8 <= fac.spectrum["bulk_top_over_edge"] <= 1.15


@pytest.mark.parametrize("seed", range(3))
def test_noise_bulk_estimate_matches_a_full_svd_fit(seed: int) -> None:
    """The randomised fit (top singular values and the energy outside them) against the fit to
    the whole spectrum."""
    noisy, _ = _noisy(30, 300, 700, seed, 1e-2)
    fast = _blind(noisy)
    full = fit_bulk(torch.linalg.svdvals(noisy), 0.0, (300, 700))
    assert full.rank == fast.batch_size == 30 and full.consistent
    assert fast.noise_estimated == pytest.approx(full.std, rel=1e-6)
    assert full.median == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("seed", range(3))
def test_pure_noise_has_nothing_above_the_bulk(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    noise = 0.3 * torch.randn(200, 600, generator=gen, dtype=torch.float64)
    fac = _blind(noise)
    assert (fac.batch_size, fac.method) == (0, "noise-bulk")
    assert fac.noise_estimated == pytest.approx(0.3, rel=0.1)


@pytest.mark.parametrize("seed", range(3))
def test_declared_noise_keeps_its_level_and_reports_the_fit(seed: int) -> None:
    noisy, noise = _noisy(20, 200, 600, seed, 1e-3)
    std = float(noise.std())
    fac = _blind(noisy, noise_std=std)
    assert (fac.batch_size, fac.method, fac.noise_std) == (20, "noise-edge", std)
    assert not fac.undeclared_noise and fac.noise_estimated == pytest.approx(std, rel=0.1)


@pytest.mark.parametrize("seed", range(3))
def test_noise_above_the_declared_level_is_reported_and_used(seed: int) -> None:
    noisy, noise = _noisy(20, 200, 600, seed, 1e-3)
    fac = _blind(noisy, noise_std=0.1 * float(noise.std()))
    assert (fac.batch_size, fac.method) == (20, "noise-bulk")
    assert fac.undeclared_noise and "times the declared" in fac.note
    assert fac.noise_std == fac.noise_estimated == pytest.approx(float(noise.std()), rel=0.1)


@pytest.mark.parametrize("seed", range(3))
def test_declared_batch_size_still_fits_undeclared_noise(seed: int) -> None:
    noisy, noise = _noisy(20, 200, 3072, seed, 1e-3)
    fac = factorise(noisy, batch_size=20, noise_std=None, precision=1e-9, generator=_gen())
    assert (fac.batch_size, fac.method) == (20, "declared") and fac.undeclared_noise
    assert fac.noise_std == fac.noise_estimated == pytest.approx(float(noise.std()), rel=0.1)
    exact = factorise(
        _gradient(20, 200, 3072, seed),
        batch_size=20,
        noise_std=None,
        precision=1e-9,
        generator=_gen(),
    )
    assert exact.noise_estimated is None and exact.noise_std == 0.0 and not exact.undeclared_noise


@pytest.mark.parametrize("seed", range(3))
def test_float32_weight_round_off_is_a_bulk(seed: int) -> None:
    """(sent - received) / lr in float64 from float32 weights: the weights' round-off over lr is
    noise the spectrum shows (the audit's float32 clients), fitted to the rounding's true std."""
    gen = torch.Generator().manual_seed(seed)
    sent = ((torch.rand(200, 3072, generator=gen, dtype=torch.float64) - 0.5) * 0.036).float()
    grad, lr = 1e-3 * _gradient(20, 200, 3072, seed), 0.01
    received = (sent.double() - lr * grad).float()
    observed = (sent.double() - received.double()) / lr
    fac = _blind(observed)
    assert (fac.batch_size, fac.method) == (20, "noise-bulk")
    assert fac.noise_estimated == pytest.approx(float((observed - grad).std()), rel=0.1)


@pytest.mark.parametrize(("weakest", "rank"), [(1.3, 5), (1.2, 4), (3.0, 5)])
def test_a_sample_near_the_threshold_lowers_the_confidence(weakest: float, rank: int) -> None:
    """Four strong samples and one of strength ``weakest`` times the noise edge (seen pushed
    up, as spikes are): just above the threshold it counts with low confidence; just below, it
    is a weak spike left out, also with low confidence; far above, confidence is full."""
    m, n = 200, 600
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(m, 5, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, 5, generator=gen, dtype=torch.float64))
    edge = math.sqrt(m) + math.sqrt(n)  # unit noise
    weights = torch.tensor([100.0, 50.0, 30.0, 20.0, weakest], dtype=torch.float64) * edge
    fac = _blind(u * weights @ v.T + torch.randn(m, n, generator=gen, dtype=torch.float64))
    assert (fac.batch_size, fac.method) == (rank, "noise-bulk")
    assert fac.noise_estimated == pytest.approx(1.0, rel=0.1)
    if weakest < 2:
        assert fac.confidence < 0.5
        assert fac.spectrum["weak_spikes"] == 5 - rank
    else:
        assert fac.confidence == 1.0


def test_full_rank_gradient_of_real_images_is_no_bulk() -> None:
    """B >= m on real CIFAR-10 images: the fit creeps into the gradient's own spectrum, whose
    top is no bulk's edge, so the batch is refused rather than cut at a false rank."""
    view, _, _ = observation(300, 200, 0)
    with pytest.raises(AttackInputError, match="B_hat=200"):
        _blind(view["grad_weight"])


@pytest.mark.parametrize(("rows", "cols"), [(180, 3052), (200, 200), (50, 800)])
def test_mp_median_matches_monte_carlo(rows: int, cols: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    draws = torch.randn(4, rows, cols, generator=gen, dtype=torch.float64)
    medians = torch.linalg.svdvals(draws).quantile(0.5, dim=1)
    assert float(medians.mean()) == pytest.approx(mp_median(rows, cols), rel=0.025)


def test_declared_batch_size_wins() -> None:
    fac = factorise(
        _gradient(12, 100, 200, 0), batch_size=12, noise_std=None, precision=1e-9, generator=_gen()
    )
    assert (fac.batch_size, fac.method) == (12, "declared")
    assert not math.isnan(float(fac.right.sum()))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("weakest", "rank"),
    [((3e-10,), 8), ((1e-11,), 8), ((1e-17,), 7), ((1e-11, 3e-14), 8), ((1e-11, 3e-13), 9)],
)
def test_a_float64_sample_under_the_floor_counts_where_it_stands_clear_of_round_off(
    seed: int, weakest: tuple[float, ...], rank: int
) -> None:
    """Seven samples and weaker ones (memorised samples), ``weakest`` times as strong: under
    the 1e-9 floor, each counts while it stands 1e3 times above float64's round-off bulk (here
    near 1e-16 of s_1), wherever the next weaker one sits: not once it sits in the bulk (1e-17)
    or too close to it (3e-14, 250 times above)."""
    gen = torch.Generator().manual_seed(seed)
    up = torch.randn(7 + len(weakest), 300, generator=gen, dtype=torch.float64)
    for i, scale in enumerate(weakest):
        up[7 + i] *= scale
    gw = up.T @ torch.randn(up.shape[0], 500, generator=gen, dtype=torch.float64)
    fac = factorise(gw, batch_size=None, noise_std=None, precision=1e-9, generator=_gen())
    assert (fac.batch_size, fac.method) == (rank, "float-rank")
