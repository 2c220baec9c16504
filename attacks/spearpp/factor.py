"""Step 1: the low-rank factorisation dL/dW = L R and the batch size read off its rank."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attacks.errors import AttackInputError

# A Gaussian m x n noise matrix of entry std s has its largest singular value near
# s (sqrt(m) + sqrt(n)); signal must clear that edge by this factor to count.
NOISE_EDGE_FACTOR = 1.5
_OVERSAMPLE = 16
# Undeclared noise: the signal must stand this far above the noise bulk at the gap.
MIN_SPECTRAL_GAP = 100.0


@dataclass(frozen=True)
class Factorisation:
    """dL/dW ~= left @ right, with ``left`` (m x B) orthonormal and ``right`` = S V^T (B x n).

    Attributes
    ----------
    left, right
        The factors, float64.
    singular_values
        The leading singular values that were computed (at least B of them).
    batch_size
        B_hat, the rank used (0 when nothing stands above the declared noise).
    method
        How B_hat was found: ``declared``, ``float-rank``, ``noise-edge`` or ``spectral-gap``.
    """

    left: torch.Tensor
    right: torch.Tensor
    singular_values: torch.Tensor
    batch_size: int
    method: str


def _top_svd(
    matrix: torch.Tensor, k: int, generator: torch.Generator, power_iters: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Leading k singular triplets; a randomised range finder unless k is the full rank."""
    m, n = matrix.shape
    if k >= min(m, n):
        u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
        return u, s, vh
    probe = torch.randn(n, k, generator=generator, dtype=matrix.dtype).to(matrix.device)
    basis, _ = torch.linalg.qr(matrix @ probe)
    for _ in range(power_iters):
        basis, _ = torch.linalg.qr(matrix.T @ basis)
        basis, _ = torch.linalg.qr(matrix @ basis)
    u_small, s, vh = torch.linalg.svd(basis.T @ matrix, full_matrices=False)
    return basis @ u_small, s, vh


def _gap_rank(s: torch.Tensor) -> int:
    """Position of the largest ratio between consecutive singular values."""
    logs = torch.log(s.clamp_min(float(s[0]) * 1e-300))
    return int(torch.argmax(logs[:-1] - logs[1:])) + 1


def factorise(
    grad_weight: torch.Tensor,
    *,
    batch_size: int | None,
    noise_std: float | None,
    precision: float,
    generator: torch.Generator,
) -> Factorisation:
    """Factor the weight gradient and settle the batch size.

    Parameters
    ----------
    grad_weight
        m x n float64 gradient of the layer's weight.
    batch_size
        Declared B, used as the rank when given.
    noise_std
        Declared per-entry noise std (DP-SGD); the rank is then the number of singular values
        above the noise edge.
    precision
        Relative round-off of the gradient: singular values below it are not samples.
    generator
        Source of the random probes (on the CPU).

    Raises
    ------
    AttackInputError
        When the declared or estimated batch size is not below m and n: the gradient is then not
        low-rank and the batch is not identifiable from it.
    """
    m, n = grad_weight.shape
    full = min(m, n)
    if batch_size is not None and not 1 <= batch_size < full:
        raise AttackInputError(
            f"batch_size={batch_size}: a batch is identifiable only for 1 <= B < min(m, n) = {full}"
        )
    if noise_std is not None and not (noise_std >= 0 and math.isfinite(noise_std)):
        raise AttackInputError(f"noise_std={noise_std!r}: must be a finite number >= 0")
    noisy = bool(noise_std)
    k = min(full, (batch_size or 112) + _OVERSAMPLE)
    while True:
        u, s, vh = _top_svd(grad_weight, k, generator, power_iters=2 if noisy else 0)
        at_full = k >= full
        if batch_size is not None:
            rank, method = batch_size, "declared"
            break
        if noisy:
            edge = NOISE_EDGE_FACTOR * float(noise_std or 0.0) * (math.sqrt(m) + math.sqrt(n))
            rank, method = int((s > edge).sum()), "noise-edge"
            if rank < k - _OVERSAMPLE or at_full:
                break
        elif float(s[-1]) <= precision * float(s[0]):
            rank, method = int((s > precision * s[0]).sum()), "float-rank"
            break
        elif at_full:
            # Without a clear gap the spectrum is the gradient's own: full rank, B >= min(m, n).
            gap_rank = _gap_rank(s)
            clear = float(s[gap_rank - 1]) >= MIN_SPECTRAL_GAP * float(s[gap_rank])
            rank, method = (gap_rank if clear else full), "spectral-gap"
            break
        k = min(full, 2 * k)
    if rank >= full:
        raise AttackInputError(
            f"estimated batch size B_hat={rank} ({method}) is not below min(m, n) = {full} "
            f"(m={m}, n={n}): the gradient is not low-rank, so SPEAR++ cannot separate the batch"
        )
    return Factorisation(
        left=u[:, :rank].contiguous(),
        right=s[:rank, None] * vh[:rank],
        singular_values=s,
        batch_size=rank,
        method=method,
    )
