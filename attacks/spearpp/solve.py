"""Steps 5-7: choosing B columns, fixing their scale and sign, and solving for the inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attacks.spearpp.inputs import LayerObservation
from attacks.spearpp.refine import ZeroRule, zero_mask

# Scales this small (relative to the largest) mean the bias gradient does not fix the column.
_TINY_SCALE = 1e-12


@dataclass(frozen=True)
class Solution:
    """Inputs for one choice of columns.

    Attributes
    ----------
    inputs
        B x n reconstruction, X = Q^-1 R with Q's columns scaled by the bias gradient.
    matching
        Per sample, the sparsity matching coefficient: the Jaccard index between the zeros of
        its output gradient L q_i and its inactive neurons {j : W_j x_i + b_j <= 0}. 1 for an
        exact reconstruction.
    """

    inputs: torch.Tensor
    matching: torch.Tensor

    @property
    def score(self) -> float:
        """Total matching, the quantity the greedy selection raises."""
        return float(self.matching.sum())


def solve_inputs(
    columns: torch.Tensor,
    left: torch.Tensor,
    right: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
) -> Solution:
    """Scale the unit ``columns`` (B x B, one per row) from the bias gradient and solve for X.

    dL/db = L Q 1, so with Q = Q_hat diag(d), L^T dL/db = Q_hat d fixes scale and sign of each
    column at once (L has orthonormal columns).
    """
    q_hat = columns.T
    target = left.T @ obs.grad_bias
    scales = torch.linalg.lstsq(q_hat, target[:, None]).solution.flatten()
    small = scales.abs() < _TINY_SCALE * scales.abs().max().clamp_min(
        torch.finfo(scales.dtype).tiny
    )
    scales = torch.where(small, torch.ones_like(scales), scales)
    mixed_inputs = torch.linalg.lstsq(q_hat, right).solution
    inputs = mixed_inputs / scales[:, None]
    zero = zero_mask(left, columns, rule)  # B x m: each sample's zero output gradients
    inactive = inputs @ obs.weight.T + obs.bias <= 0
    union = (zero | inactive).sum(dim=1).clamp_min(1)
    matching = (zero & inactive).sum(dim=1) / union
    return Solution(inputs=inputs, matching=matching.to(torch.float64))


def complete_basis(columns: torch.Tensor, spares: torch.Tensor, size: int) -> torch.Tensor:
    """Fill a short set of columns up to ``size``: best spares first, then an orthonormal
    complement of their span (step 7), so a short pool still yields a partial reconstruction."""
    chosen = torch.cat([columns, spares[: size - columns.shape[0]]])
    missing = size - chosen.shape[0]
    if missing > 0:
        u, _, _ = torch.linalg.svd(chosen.T, full_matrices=True)
        chosen = torch.cat([chosen, u[:, chosen.shape[0] :].T])
    return chosen


def greedy_select(
    pool: torch.Tensor,
    size: int,
    left: torch.Tensor,
    right: torch.Tensor,
    obs: LayerObservation,
    rule: ZeroRule,
    sweeps: int,
) -> tuple[torch.Tensor, Solution]:
    """SPEAR's selection: from more than ``size`` candidate columns (rows of ``pool``, sorted by
    preference) pick ``size``, swapping greedily while the total sparsity matching rises.

    Each outside candidate is tried in place of the chosen column it is most aligned with, the
    one it most plausibly competes with; a swap is kept when the total matching rises.
    """
    chosen = list(range(size))
    best = solve_inputs(pool[chosen], left, right, obs, rule)
    for _ in range(sweeps):
        improved = False
        for cand in range(size, pool.shape[0]):
            if cand in chosen:
                continue
            rival = int((pool[chosen] @ pool[cand]).abs().argmax())
            trial = chosen.copy()
            trial[rival] = cand
            solution = solve_inputs(pool[trial], left, right, obs, rule)
            if solution.score > best.score:
                chosen, best, improved = trial, solution, True
        if not improved:
            break
    return pool[chosen], best
