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


def decibels(mse: torch.Tensor) -> torch.Tensor:
    """PSNR in dB of mean squared errors on the [0, 1] scale (peak 1), capped at ``PSNR_CAP``."""
    return (10 * torch.log10(1.0 / mse.clamp_min(10 ** (-PSNR_CAP / 10)))).clamp(max=PSNR_CAP)


def psnr(reconstructed: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """PSNR in dB per sample on the [0, 1] scale (peak 1), capped at ``PSNR_CAP``."""
    return decibels((reconstructed - original).flatten(1).square().mean(dim=1))


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


# What :func:`judge_certificates` counts, by key.
JUDGED = ("certified_not_exact", "certified_not_near_exact", "exact_uncertified")


def judge_certificates(
    reconstructed: torch.Tensor, original: torch.Tensor, certified: torch.Tensor
) -> dict[str, int]:
    """What the attack vouched for (``certified``: per reconstruction), against the truth.

    A certificate says "this reconstruction is one of the batch's samples", so each certified
    reconstruction is judged against its nearest true sample (not the Hungarian match, which
    may pair an exact reconstruction with another sample to lower the total cost when the rest
    are wrong). ``certified_not_exact``: certified reconstructions under 100 dB of every true
    sample; ``certified_not_near_exact``: under 40 dB (a wrong sample, not round-off or noise);
    ``exact_uncertified``: true samples some reconstruction matches at >= 100 dB, none of them
    certified.
    """
    rec = reconstructed.to(torch.float64).cpu().flatten(1)
    orig = original.to(torch.float64).cpu().flatten(1)
    db = decibels(torch.cdist(rec, orig).square() / orig.shape[1])
    vouched = certified.to(torch.bool).cpu()
    best = db.amax(dim=1) if len(orig) else torch.zeros(len(rec), dtype=torch.float64)
    exact = db >= EXACT_DB  # reconstruction x true sample
    return {
        "certified_not_exact": int((vouched & (best < EXACT_DB)).sum()),
        "certified_not_near_exact": int((vouched & (best < NEAR_EXACT_DB)).sum()),
        "exact_uncertified": int((exact.any(dim=0) & ~(exact & vouched[:, None]).any(dim=0)).sum()),
    }


def match_and_score(reconstructed: torch.Tensor, original: torch.Tensor) -> BatchQuality:
    """Hungarian matching on PSNR, then PSNR, MSE and (images only) SSIM per true sample.

    The matching maximises the summed PSNR (capped), not minimises the summed MSE: a sum of
    squared errors is ruled by the worst reconstructions, so next to a few far-off ones (an
    engine's scale gone wrong, pixels on [0, 1]) it paired exact reconstructions with other
    samples and reported none exact where the attacker held several (B=20, m=256, [0, 1]
    inputs: 4 reconstructions at 150 dB of 4 distinct samples, share exact 0). On PSNR an exact
    pair outweighs any reshuffling of the rest.

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
    db = decibels(torch.cdist(orig.flatten(1), rec.flatten(1)).square() / orig[0].numel())
    rows, cols = linear_sum_assignment((-db).numpy())
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
