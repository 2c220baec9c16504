"""What every local training procedure shares: index batches, SGD steps (DP-SGD's in chunks of
per-sample gradients), what a round reports (:class:`TrainResult`) and when training diverged.

The procedures themselves are training defences, one module each in :mod:`clients.defences`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from opacus.optimizers import DPOptimizer
from torch import nn

# Bytes of per-sample gradients DP-SGD holds at once: a depth-6, m=4000 network (76 M float64
# parameters, 0.6 GB per sample) then takes 3 samples at a time instead of a whole batch of 150
# (91 GB).
PER_SAMPLE_BUDGET = 2 << 30
# A federation's client whose training leaves its own batch's loss more than this many times
# its first step's loss (counted from at least 1 nat: chance on 10 classes is 2.3) has diverged.
# Its weights may still be finite, yet aggregated they blow up the global model and every client
# diverges after it (lr=1e4 on the quickstart: 2.3 to about 1e25 in one DP step).
DIVERGENCE_FACTOR = 1e3


class DivergenceError(ArithmeticError):
    """Local training left the model unusable: a non-finite loss or weight, or a loss that
    blew up. The client reports it instead of sending the update."""


@dataclass(frozen=True)
class TrainResult:
    """What local training did.

    Attributes
    ----------
    steps
        Optimiser steps taken.
    loss
        Mean training loss over the steps.
    first_loss
        The first step's loss (at the weights the client was sent).
    noise_std
        Per-entry std of the noise in each step's averaged gradient (0 without DP).
    sample_rate
        Share of the local batch each step samples (mini_batch / B).
    """

    steps: int
    loss: float
    noise_std: float
    sample_rate: float = 1.0
    first_loss: float = 0.0


def batches(
    n: int, size: int, epochs: int, generator: torch.Generator, poisson: bool = False
) -> list[torch.Tensor]:
    """Index batches: shuffled splits per epoch, or Poisson draws at rate size / n."""
    out: list[torch.Tensor] = []
    for _ in range(epochs):
        if poisson:
            steps = math.ceil(n / size)
            draws = torch.rand(steps, n, generator=generator) < size / n
            out += [torch.nonzero(row).flatten() for row in draws]
        else:
            out += list(torch.randperm(n, generator=generator).split(size))
    return out


def physical_batch(model: nn.Module, budget_bytes: int) -> int:
    """Samples whose per-sample gradients fit ``budget_bytes`` together (at least one)."""
    per_sample = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return max(1, budget_bytes // max(1, per_sample))


def sgd_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    batches: list[torch.Tensor],
    physical: int | None = None,
) -> tuple[float, float]:
    """One optimiser step per batch; the mean loss and the first batch's loss.

    With a ``DPOptimizer``, each batch's per-sample gradients are computed ``physical``
    samples at a time: Opacus clips and sums every chunk (skipped steps accumulate) and adds
    the noise once, at the batch's last chunk, so the step equals one on the whole batch.
    """
    losses = []
    for idx in batches:
        if len(idx) == 0:  # an empty Poisson draw: nothing of the data to release
            continue
        chunks = idx.split(physical) if isinstance(optimizer, DPOptimizer) and physical else [idx]
        total = 0.0
        for i, chunk in enumerate(chunks):
            if isinstance(optimizer, DPOptimizer):
                optimizer.signal_skip_step(do_skip=i < len(chunks) - 1)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[chunk]), y[chunk])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(chunk) / len(idx)
        losses.append(total)
    return sum(losses) / max(1, len(losses)), losses[0] if losses else 0.0


def divergence(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    result: TrainResult,
    max_loss_growth: float | None = None,
) -> str | None:
    """Why training diverged, or ``None``: a non-finite training loss or non-finite weights;
    with ``max_loss_growth``, also a loss on the batch at the trained weights (one forward
    pass, no gradient) that is non-finite or above ``max_loss_growth`` times the first step's
    loss, counted from at least 1 nat."""
    if not math.isfinite(result.loss):
        return f"training loss is {result.loss} (mean over {result.steps} steps)"
    broken = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if broken:
        return f"weights {broken} hold NaN or infinite values after training"
    if max_loss_growth is None:
        return None
    with torch.no_grad():
        final = float(nn.functional.cross_entropy(model(x), y))
    limit = max_loss_growth * max(result.first_loss, 1.0)
    if not final <= limit:  # also NaN
        return (
            f"loss on its batch went from {result.first_loss:.3g} to {final:.3g} in "
            f"{result.steps} step{'s' if result.steps != 1 else ''} (limit {limit:.3g})"
        )
    return None
