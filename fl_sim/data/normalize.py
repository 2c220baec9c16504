"""Per-channel input normalisation, recorded so that the audit can undo it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# CIFAR-10 training-set channel statistics on [0, 1] pixels.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


@dataclass(frozen=True)
class Normalization:
    """x_normalised = (x - mean) / std per channel, on images of shape (..., C, H, W) in [0, 1]."""

    mean: tuple[float, ...] = CIFAR10_MEAN
    std: tuple[float, ...] = CIFAR10_STD

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = torch.tensor(self.mean, dtype=like.dtype, device=like.device)[:, None, None]
        std = torch.tensor(self.std, dtype=like.dtype, device=like.device)[:, None, None]
        return mean, std

    def apply(self, images: torch.Tensor) -> torch.Tensor:
        """Normalise images (..., C, H, W) given on [0, 1]."""
        mean, std = self._stats(images)
        return (images - mean) / std

    def undo(self, images: torch.Tensor) -> torch.Tensor:
        """Back to [0, 1] pixels (not clipped: exactness is measured on the raw values)."""
        mean, std = self._stats(images)
        return images * std + mean
