"""Per-channel (images) or per-feature (tabular records) input normalisation, recorded so that
the audit can undo it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# CIFAR-10 training-set channel statistics on [0, 1] pixels.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def per_entry(values: tuple[float, ...], like: torch.Tensor, ndim: int) -> torch.Tensor:
    """``values``, one per entry of a sample's first axis, shaped to broadcast against a batch
    ``like`` of samples with ``ndim`` dimensions each (C x 1 x 1 for images, n for records)."""
    out = torch.tensor(values, dtype=like.dtype, device=like.device)
    return out.reshape(-1, *([1] * (ndim - 1)))


def to_unit(
    records: np.ndarray, low: tuple[float, ...], high: tuple[float, ...], dtype: torch.dtype
) -> torch.Tensor:
    """Raw records (k x sample shape) on the [0, 1] scale of the value range ``low`` to
    ``high`` (one per entry of a sample's first axis), as ``dtype``."""
    x = torch.from_numpy(records).to(dtype)
    ndim = records.ndim - 1
    span = tuple(h - lo for lo, h in zip(low, high, strict=True))
    return (x - per_entry(low, x, ndim)) / per_entry(span, x, ndim)


@dataclass(frozen=True)
class Normalization:
    """x_normalised = (x - mean) / std per entry of a sample's first axis, on samples given on
    the data's [0, 1] scale.

    Attributes
    ----------
    mean, std
        One per channel (images) or feature (records).
    ndim
        Dimensions of one sample: 3 for C x H x W images, 1 for feature vectors.
    """

    mean: tuple[float, ...] = CIFAR10_MEAN
    std: tuple[float, ...] = CIFAR10_STD
    ndim: int = 3

    def apply(self, samples: torch.Tensor) -> torch.Tensor:
        """Normalise samples (..., *sample shape) given on [0, 1]."""
        mean, std = (per_entry(v, samples, self.ndim) for v in (self.mean, self.std))
        return (samples - mean) / std

    def undo(self, samples: torch.Tensor) -> torch.Tensor:
        """Back to the [0, 1] scale (not clipped: exactness is measured on the raw values)."""
        mean, std = (per_entry(v, samples, self.ndim) for v in (self.mean, self.std))
        return samples * std + mean


def fitted_normalization(unit: torch.Tensor) -> Normalization:
    """Mean and std per channel or feature of ``unit`` (N x sample shape, on the [0, 1]
    scale): the normalisation that centres these samples."""
    array = unit.to(torch.float64).numpy()
    # One row per value, one column per channel or feature.
    values = np.moveaxis(array, 1, -1).reshape(-1, array.shape[1])
    return Normalization(
        tuple(values.mean(0).tolist()), tuple(values.std(0).tolist()), ndim=array.ndim - 1
    )
