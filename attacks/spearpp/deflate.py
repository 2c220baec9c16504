"""Finding the columns the multi-start search keeps missing, by convex l1 minimisation.

Search basins are uneven: fresh starts mostly fall back into columns already found. Here each
trial minimises ||L q||_1 over the hyperplane h^T q = 1, with h drawn from the orthogonal
complement of the found columns. Every found column lies in h's null space and so off the
hyperplane, while every missing column (scaled) lies on it: the convex problem can only return
a missing column (or a mix, which certification rejects). Solved by iteratively reweighted least
squares, batched over trials.
"""

from __future__ import annotations

import torch

from attacks.spearpp.spd import solve_spd

_ITERATIONS = 60
# Smoothing of the reweighting, relative to the median |L q|: starts loose, shrinks each
# iteration, and stops at float64 round-off.
_EPS_START = 0.1
_EPS_DECAY = 0.7
_EPS_FLOOR = 1e-12


def complement_probes(
    found: torch.Tensor, count: int, generator: torch.Generator, spread: float = 0.0
) -> torch.Tensor:
    """``count`` random unit vectors orthogonal to every found column (rows of ``found``).

    With ``spread`` > 0, a uniform random unit vector of that weight is added before
    normalising: the probes then lean away from the found columns without all collapsing onto
    a complement of very few dimensions.
    """
    b = found.shape[1]
    raw = torch.randn(count, b, generator=generator, dtype=torch.float64).to(found.device)
    probes = raw
    if found.shape[0]:
        basis, _ = torch.linalg.qr(found.T)  # B x k, orthonormal span of the found columns
        probes = probes - (probes @ basis) @ basis.T
    probes = torch.nn.functional.normalize(probes, dim=1)
    if spread:
        probes = probes + spread * torch.nn.functional.normalize(raw, dim=1)
    return torch.nn.functional.normalize(probes, dim=1)


def l1_on_hyperplanes(left: torch.Tensor, probes: torch.Tensor, power: float = 1.0) -> torch.Tensor:
    """For each probe h (rows), argmin ||L q||_1 subject to h^T q = 1, as unit directions.

    Parameters
    ----------
    left
        The m x B factor (float64, orthonormal columns).
    probes
        T x B constraint vectors.
    """
    h = probes
    q = h / h.square().sum(dim=1, keepdim=True)  # the least-squares start (L^T L = I)
    for it in range(_ITERATIONS):
        y = (q @ left.T).abs()
        scale = y.median(dim=1, keepdim=True).values
        eps = (scale * _EPS_START * _EPS_DECAY**it).clamp_min(_EPS_FLOOR * y.amax(1, keepdim=True))
        weights = torch.maximum(y, eps).pow(power - 2.0)
        gram = torch.einsum("mb,tm,mc->tbc", left, weights, left)
        z = solve_spd(gram, h[:, :, None]).squeeze(2)
        q = z / (z * h).sum(dim=1, keepdim=True)
    return torch.nn.functional.normalize(q, dim=1)
