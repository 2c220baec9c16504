"""Matching reconstructions to true samples, and per-sample and per-batch quality.

Samples are compared on their data's [0, 1] scale (:class:`fl_sim.data.description.
DataDescription`): pixels / 255 for images, each feature min-max scaled over the dataset for
tabular records. PSNR has peak 1 on both, so its dB read alike for an image and a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from skimage.metrics import structural_similarity

# PSNR is capped where the MSE reaches float64 round-off of [0, 1] pixels.
PSNR_CAP = 150.0
EXACT_DB = 100.0
NEAR_EXACT_DB = 40.0


def psnr(reconstructed: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """PSNR in dB per sample on the [0, 1] scale (peak 1), capped at ``PSNR_CAP``."""
    mse = (reconstructed - original).flatten(1).square().mean(dim=1)
    return (10 * torch.log10(1.0 / mse.clamp_min(10 ** (-PSNR_CAP / 10)))).clamp(max=PSNR_CAP)


@dataclass(frozen=True)
class BatchQuality:
    """How well a batch came back, sample by sample.

    Attributes
    ----------
    match
        For each true sample, the index of its reconstruction (-1: none left to match).
    psnr, mse
        Per true sample; an unmatched sample scores 0 dB and the MSE of an all-zero sample.
    ssim
        Per true sample for images (0 when unmatched); ``None`` for tabular records, which
        have no neighbouring pixels to compare structure over.
    """

    match: np.ndarray
    psnr: np.ndarray
    mse: np.ndarray
    ssim: np.ndarray | None

    @property
    def share_exact(self) -> float:
        """Share of true samples reconstructed at >= 100 dB."""
        return float((self.psnr >= EXACT_DB).mean())

    @property
    def share_near_exact(self) -> float:
        """Share of true samples reconstructed at >= 40 dB."""
        return float((self.psnr >= NEAR_EXACT_DB).mean())

    def summary(self) -> dict[str, Any]:
        """Per-batch figures; every one says what it is over (true samples)."""
        return {
            "samples": len(self.psnr),
            "matched": int((self.match >= 0).sum()),
            "psnr_mean": float(self.psnr.mean()),
            "psnr_min": float(self.psnr.min()),
            "mse_mean": float(self.mse.mean()),
            "ssim_mean": None if self.ssim is None else float(self.ssim.mean()),
            "share_exact": self.share_exact,
            "share_near_exact": self.share_near_exact,
            "batch_exact": bool(self.share_exact == 1.0),
        }


def judge_certificates(quality: BatchQuality, certified: torch.Tensor) -> dict[str, int]:
    """What the attack vouched for (``certified``: per reconstruction), against the truth.

    ``certified_not_exact``: certified reconstructions under 100 dB of their true sample,
    or matched to none; ``certified_not_near_exact``: the same under 40 dB (a wrong sample,
    not round-off or noise); ``exact_uncertified``: true samples back at >= 100 dB whose
    reconstruction was not certified.
    """
    vouched = certified.to(torch.bool).cpu().numpy()
    matched = quality.match >= 0
    on_truth = np.zeros(len(quality.psnr), dtype=bool)
    on_truth[matched] = vouched[quality.match[matched]]
    spare = int(vouched.sum()) - int(on_truth.sum())  # vouched for a sample that was not there
    return {
        "certified_not_exact": int((on_truth & (quality.psnr < EXACT_DB)).sum()) + spare,
        "certified_not_near_exact": int((on_truth & (quality.psnr < NEAR_EXACT_DB)).sum()) + spare,
        "exact_uncertified": int((~on_truth & (quality.psnr >= EXACT_DB)).sum()),
    }


def match_and_score(reconstructed: torch.Tensor, original: torch.Tensor) -> BatchQuality:
    """Hungarian matching on MSE, then PSNR, MSE and (images only) SSIM per true sample.

    Parameters
    ----------
    reconstructed
        B_hat x sample shape on the [0, 1] scale (normalisation undone): images C x H x W,
        tabular records n features.
    original
        B x sample shape, the true samples on the same scale.
    """
    rec = reconstructed.to(torch.float64).cpu()
    orig = original.to(torch.float64).cpu()
    cost = torch.cdist(orig.flatten(1), rec.flatten(1)).square() / orig[0].numel()
    rows, cols = linear_sum_assignment(cost.numpy())
    b = orig.shape[0]
    match = np.full(b, -1)
    match[rows] = cols
    paired = torch.zeros_like(orig)
    paired[torch.as_tensor(rows)] = rec[torch.as_tensor(cols)]
    mse = (paired - orig).flatten(1).square().mean(dim=1).numpy()
    scores = psnr(paired, orig).numpy()
    ssim = None
    if orig.ndim == 4:  # images, B x C x H x W
        ssim = np.zeros(b)
        for i in rows:
            ssim[i] = structural_similarity(
                paired[i].permute(1, 2, 0).numpy(),
                orig[i].permute(1, 2, 0).numpy(),
                channel_axis=2,
                data_range=1.0,
            )
    unmatched = match < 0
    scores[unmatched] = 0.0
    return BatchQuality(match=match, psnr=scores, mse=mse, ssim=ssim)
