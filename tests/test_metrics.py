"""Matching and metrics on known inputs."""

from __future__ import annotations

import numpy as np
import torch

from fl_sim.audit.metrics import PSNR_CAP, match_and_score, psnr


def test_psnr_of_known_mse() -> None:
    a = torch.zeros(2, 3, 4, 4, dtype=torch.float64)
    b = a.clone()
    b[0] += 0.1  # MSE 0.01 -> 20 dB
    assert torch.allclose(psnr(b, a), torch.tensor([20.0, PSNR_CAP], dtype=torch.float64))


def test_matching_undoes_a_permutation() -> None:
    g = torch.Generator().manual_seed(0)
    orig = torch.rand(6, 3, 32, 32, generator=g, dtype=torch.float64)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    q = match_and_score(orig[perm] + 1e-3, orig)
    assert np.array_equal(perm[q.match].numpy(), np.arange(6))
    assert np.allclose(q.psnr, 60.0)
    assert q.share_exact == 0.0 and q.share_near_exact == 1.0
    assert np.all(q.ssim > 0.99)


def test_exact_and_unmatched_samples() -> None:
    g = torch.Generator().manual_seed(1)
    orig = torch.rand(4, 3, 32, 32, generator=g, dtype=torch.float64)
    q = match_and_score(orig[:3].clone(), orig)  # one sample never reconstructed
    s = q.summary()
    assert s["matched"] == 3 and s["share_exact"] == 0.75 and not s["batch_exact"]
    assert q.psnr[3] == 0.0 and q.ssim[3] == 0.0
    assert np.allclose(q.ssim[:3], 1.0)


def test_certificates_are_judged_against_the_nearest_true_sample() -> None:
    """An exact certified reconstruction counts as right even where the Hungarian matching
    pairs it elsewhere; a certified blend counts as wrong; an exact uncertified one is missed."""
    from fl_sim.audit.metrics import judge_certificates

    truth = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.2, 0.9]], dtype=torch.float64)
    rec = torch.tensor([[1.0, 1.0], [0.5, 0.5], [0.0, 0.0]], dtype=torch.float64)
    judged = judge_certificates(rec, truth, torch.tensor([True, True, False]))
    assert judged == {
        "certified_not_exact": 1,  # the blend [0.5, 0.5]
        "certified_not_near_exact": 1,
        "exact_uncertified": 1,  # [0, 0], reconstructed exactly but not certified
    }


def test_an_exact_reconstruction_is_matched_beside_far_off_ones() -> None:
    """Next to a reconstruction far off along a - b, matching on squared error pairs the exact
    copy of a with b (its total is smaller); on PSNR the exact pair stands."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.rand(2, 3, 8, 8, generator=g, dtype=torch.float64)
    orig = torch.stack([a, b])
    rec = torch.stack([a.clone(), a + 3 * (a - b)])
    squared = torch.cdist(orig.flatten(1), rec.flatten(1)).square()
    assert squared[0, 1] + squared[1, 0] < squared[0, 0] + squared[1, 1]  # MSE would swap
    q = match_and_score(rec, orig)
    assert q.match.tolist() == [0, 1] and q.psnr[0] == PSNR_CAP and q.share_exact == 0.5
