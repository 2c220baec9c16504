"""The forecast's math: Lanczos extremes, LAVP against dense input Hessians, Spearman."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, hessian

from fl_sim.forecast import extreme_eigenvalues, sample_proxies, spearman, spearman_interval
from fl_sim.model import fc_relu_net


def _dense_hessians(
    net: torch.nn.Module, x: torch.Tensor, y: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Brute force: the full input Hessian of each attack loss at x*, by double autodiff."""
    params = {k: v.detach() for k, v in net.named_parameters()}
    label = torch.tensor([y])

    def gradient(z: torch.Tensor) -> torch.Tensor:
        def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
            out = functional_call(net, p, (z.unsqueeze(0),))
            return torch.nn.functional.cross_entropy(out, label)

        g = grad(loss)(params)
        return torch.cat([t.flatten() for t in g.values()])

    target = gradient(x).detach()

    def l2(z: torch.Tensor) -> torch.Tensor:
        return (gradient(z) - target).square().sum()

    def cosine(z: torch.Tensor) -> torch.Tensor:
        g = gradient(z)
        return 1 - g @ target / (g.norm() * target.norm())

    return hessian(l2)(x), hessian(cosine)(x), float(target.norm())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(("input_dim", "width", "depth"), [(12, 6, 3), (48, 16, 4)])
def test_lavp_matches_the_dense_hessian(seed: int, input_dim: int, width: int, depth: int) -> None:
    torch.manual_seed(seed)
    net = fc_relu_net(width, depth, input_dim=input_dim).double()
    x = torch.randn(input_dim, dtype=torch.float64)
    y = seed % 10
    h_l2, h_cos, norm = _dense_hessians(net, x, y)
    dense_l2, dense_cos = torch.linalg.eigvalsh(h_l2), torch.linalg.eigvalsh(h_cos)
    got = sample_proxies(net, dict(net.named_parameters()), x, y, seed=seed)
    assert got.converged
    scale_l2, scale_cos = float(dense_l2.abs().max()), float(dense_cos.abs().max())
    assert got.lavp_l2_max == pytest.approx(float(dense_l2[-1]), abs=1e-9 * scale_l2)
    assert got.lavp_l2_min == pytest.approx(float(dense_l2[0]), abs=1e-9 * scale_l2)
    assert got.lavp_cos_max == pytest.approx(float(dense_cos[-1]), abs=1e-9 * scale_cos)
    assert got.lavp_cos_min == pytest.approx(float(dense_cos[0]), abs=1e-9 * scale_cos)
    assert got.grad_norm == pytest.approx(norm, rel=1e-12)
    assert got.lavp_fused == pytest.approx(math.sqrt(got.lavp_l2_max * got.lavp_cos_min))


def _symmetric(spectrum: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(
        torch.randn(len(spectrum), len(spectrum), generator=gen, dtype=torch.float64)
    )
    return (q * spectrum) @ q.T


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lanczos_finds_both_ends_of_a_known_spectrum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # Clustered interior, isolated ends: the shape of the LAVP Hessians (a multiple eigenvalue
    # plus a low-rank part).
    spectrum = torch.tensor(
        np.concatenate([[0.01], np.full(300, 1.0), rng.uniform(1.0, 5.0, 20), [40.0]])
    )
    a = _symmetric(spectrum, seed)
    got = extreme_eigenvalues(
        lambda v: a @ v,
        len(spectrum),
        tol=1e-10,
        max_iter=200,
        generator=torch.Generator().manual_seed(seed),
    )
    assert got.converged and got.iterations < 60
    assert got.smallest == pytest.approx(0.01, abs=1e-8) and got.largest == pytest.approx(40.0)


def test_lanczos_reports_the_cap_and_an_invariant_space() -> None:
    spectrum = torch.linspace(1.0, 2.0, 400, dtype=torch.float64)  # no gaps: slow ends
    a = _symmetric(spectrum, 0)
    capped = extreme_eigenvalues(lambda v: a @ v, 400, tol=1e-12, max_iter=5)
    assert capped.iterations == 5 and not capped.converged and capped.residual > 1e-12
    small = extreme_eigenvalues(lambda v: 3.0 * v, 7)  # one eigenvalue: exact at once
    assert small.converged and small.iterations == 1 and small.smallest == pytest.approx(3.0)
    with pytest.raises(ValueError, match="tol"):
        extreme_eigenvalues(lambda v: v, 3, tol=0.0)


def test_spearman_on_known_data_with_ties() -> None:
    # Hand-computed: ranks x = (1, 2.5, 2.5, 4, 5), y = (5, 3.5, 3.5, 2, 1); rho = -1.
    assert spearman([1, 2, 2, 3, 4], [9, 7, 7, 2, 1]) == pytest.approx(-1.0)
    # Ranks x = (1, 2, 3, 4), y = (1, 3, 2, 4): 1 - 6 * 2 / (4 * 15) = 0.8 (no ties).
    assert spearman([10, 20, 30, 40], [0.1, 0.3, 0.2, 0.4]) == pytest.approx(0.8)
    # Ties in both: ranks x = (1.5, 1.5, 3, 4), y = (1, 2.5, 2.5, 4); Pearson of the ranks.
    rx, ry = np.array([1.5, 1.5, 3, 4]), np.array([1, 2.5, 2.5, 4])
    expected = np.corrcoef(rx, ry)[0, 1]
    assert spearman([5, 5, 6, 7], [1, 2, 2, 3]) == pytest.approx(expected)
    assert spearman([1, 2], [2, 1]) is None
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    with pytest.raises(ValueError, match="equal length"):
        spearman([1, 2, 3], [1, 2])


def test_spearman_interval_brackets_rho() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100)
    y = -x + 0.8 * rng.standard_normal(100)
    low, high = spearman_interval(x, y, resamples=500) or (0.0, 0.0)
    rho = spearman(x, y)
    assert rho is not None and low < rho < high and high - low < 0.35
    assert spearman_interval([1, 2, 3, 4], [1, 2, 3, 4], resamples=50) == (1.0, 1.0)
    assert spearman_interval([1, 1, 1], [1, 2, 3]) is None


def test_exposure_ranks_clients_and_reads_old_records() -> None:
    from fl_sim.forecast import PROXIES
    from fl_sim.forecast.table import client_exposure, joined_samples, round_correlations

    proxy_rows = [
        {
            "round": 1,
            "client": c,
            "defence": "fedsgd",
            "samples": [
                {"id": 10 * c + i, "label": i, **dict.fromkeys(PROXIES, float(c + 1 + i))}
                for i in range(3)
            ],
        }
        for c in range(2)
    ]
    records = [  # an old SPEAR++ record (no 'attack' key) and the inversion attack's
        {"round": 1, "client": c, "psnr_mean": 150.0 - c, "share_exact": 1.0, "status": "exact"}
        for c in range(2)
    ] + [
        {
            "round": 1,
            "client": c,
            "attack": "inversion",
            "loss": "cosine",
            "samples": [
                {"id": 10 * c + i, "mse": 1.0 / (c + 1 + i), "psnr": 0.0} for i in range(3)
            ],
        }
        for c in range(2)
    ]
    samples = joined_samples(records, proxy_rows)
    assert len(samples) == 6 and all("mse:inversion-cosine" in s for s in samples)
    rows = round_correlations(samples)
    assert [r["round"] for r in rows] == [1, None]
    assert rows[0]["spearman"]["lavp_cos_min"] == pytest.approx(-1.0)  # larger proxy, lower MSE
    exposure = client_exposure(samples, records)
    assert [e["rank"]["grad_norm"] for e in exposure] == [2, 1]  # client 1 has the larger values
    assert exposure[0]["spearpp_psnr_mean"] == 150.0
