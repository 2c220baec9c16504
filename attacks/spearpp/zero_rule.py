"""When an entry of L q counts as zero: the gradient's round-off, the noise, or the user's
floor, per direction q."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The noise floor of an entry of L q is (noise std) x ||S^-1 q||; zeros are taken within this many.
_NOISE_SIGMAS = 3.0
# Two verified directions this close (|cosine|) are the same column found twice; under noise
# two estimates of one column differ more.
SAME_COLUMN_COSINE = 0.999
SAME_COLUMN_COSINE_NOISY = 0.98


@dataclass(frozen=True)
class ZeroRule:
    """When an entry of L q counts as zero.

    Attributes
    ----------
    relative
        Floor relative to max |L q|: the gradient's round-off, or the user's ``zero_tol``.
    noise_std
        Per-entry std of noise added to the gradient (0 when none was declared).
    inverse_singular
        1 / S of the factorisation, mapping a direction to the size of its noise.
    roundoff
        Without noise, the level of the spectrum's bulk beyond B (about the norm of the
        gradient's round-off off its rank), or 0. The round-off moves L q by up to
        ``roundoff`` x |S^-1 q|, which along weak singular values can pass the relative floor:
        min-max scaled tabular records (B=25, m=256, s_B / s_1 = 1.2e-4, s_B+1 / s_1 = 1.7e-12)
        left true columns' zeros at 1e-9 to 1.5e-9 of their largest entries (their smallest
        nonzero: 1.5e-4 and more), so 1 to 4 zeros of 5 samples of 25 counted as active.
    """

    relative: float
    noise_std: float
    inverse_singular: torch.Tensor
    roundoff: float = 0.0

    @property
    def same_column_cosine(self) -> float:
        """|cosine| above which two directions are one column."""
        return SAME_COLUMN_COSINE_NOISY if self.noise_std else SAME_COLUMN_COSINE

    def entry_std(self, q: torch.Tensor) -> torch.Tensor:
        """Std of the noise on each entry of L q, per row of ``q`` (c x B); 0 without noise."""
        std: torch.Tensor = self.noise_std * (q * self.inverse_singular).norm(dim=1)
        return std

    def tolerance(self, q: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Absolute zero tolerance per row of ``q`` (c x B) with ``y = q L^T`` (c x m)."""
        tol = self.relative * y.abs().amax(dim=1)
        if self.roundoff:
            tol = torch.maximum(tol, self.roundoff * (q * self.inverse_singular).norm(dim=1))
        if self.noise_std:
            tol = torch.maximum(tol, _NOISE_SIGMAS * self.entry_std(q))
        return tol


def zero_mask(left: torch.Tensor, q: torch.Tensor, rule: ZeroRule) -> torch.Tensor:
    """Which entries of L q (c x m) count as zero under ``rule``, for directions ``q`` (c x B)."""
    y = q @ left.T
    return y.abs() <= rule.tolerance(q, y)[:, None]
