"""Local training by defence: ``fedsgd`` (one step), ``fedavg`` (E epochs of mini-batch SGD) and
``dp`` (DP-SGD through Opacus, with fedavg's epochs and mini-batches).

Each procedure trains a model in place and reports what the server will see in the update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from opacus import GradSampleModule
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
class LocalTraining:
    """A client's training settings.

    Parameters
    ----------
    defence
        ``fedsgd``, ``fedavg`` or ``dp``.
    lr
        Learning rate of local SGD.
    epochs
        Local epochs (``fedsgd``: 1).
    mini_batch
        Mini-batch size (``fedsgd``: the whole batch; ``None``: the whole batch).
    clip
        DP-SGD per-sample clip norm C.
    noise_multiplier
        DP-SGD noise multiplier sigma (noise std sigma * C on the summed gradient).
    poisson
        DP-SGD with Poisson sampling: each step takes every sample with probability
        mini_batch / B (random batch sizes, empty batches skipped), as the RDP accountant assumes;
        otherwise shuffled fixed-size mini-batches.
    """

    defence: str = "fedsgd"
    lr: float = 0.01
    epochs: int = 1
    mini_batch: int | None = None
    clip: float = 1.0
    noise_multiplier: float = 0.0
    poisson: bool = False

    def __post_init__(self) -> None:
        if self.defence not in TRAINERS:
            raise ValueError(f"defence={self.defence!r}: allowed are {', '.join(TRAINERS)}")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r}: must be > 0")
        if self.epochs < 1:
            raise ValueError(f"epochs={self.epochs!r}: must be >= 1")
        if self.defence == "fedsgd" and (self.epochs != 1 or self.mini_batch is not None):
            raise ValueError("defence='fedsgd' takes one full-batch step: no epochs or mini_batch")
        if self.mini_batch is not None and self.mini_batch < 1:
            raise ValueError(f"mini_batch={self.mini_batch!r}: must be >= 1")
        if self.clip <= 0 or self.noise_multiplier < 0:
            raise ValueError(
                f"clip={self.clip!r}, noise_multiplier={self.noise_multiplier!r}: "
                "need clip > 0 and noise_multiplier >= 0"
            )


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


Trainer = Callable[
    [nn.Module, torch.Tensor, torch.Tensor, LocalTraining, torch.Generator], TrainResult
]


def _batches(
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


def _sgd(
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


def train_fedsgd(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: LocalTraining, gen: torch.Generator
) -> TrainResult:
    """One SGD step on the whole batch: the update is -lr times the batch gradient."""
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    loss, first = _sgd(model, opt, x, y, [torch.arange(len(x))])
    return TrainResult(steps=1, loss=loss, noise_std=0.0, first_loss=first)


def train_fedavg(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: LocalTraining, gen: torch.Generator
) -> TrainResult:
    """E epochs of SGD over shuffled mini-batches: E x ceil(B / b_mini) steps."""
    size = min(cfg.mini_batch or len(x), len(x))
    batches = _batches(len(x), size, cfg.epochs, gen)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    loss, first = _sgd(model, opt, x, y, batches)
    return TrainResult(
        len(batches), loss, noise_std=0.0, sample_rate=size / len(x), first_loss=first
    )


def train_dp(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: LocalTraining, gen: torch.Generator
) -> TrainResult:
    """DP-SGD (Opacus): per-sample clipping to C, Gaussian noise sigma * C on each step's sum,
    averaged over the mini-batch; epochs and mini-batches as in ``fedavg``. Per-sample
    gradients are held for as many samples at once as fit :data:`PER_SAMPLE_BUDGET`."""
    size = min(cfg.mini_batch or len(x), len(x))
    batches = _batches(len(x), size, cfg.epochs, gen, cfg.poisson)
    physical = physical_batch(model, PER_SAMPLE_BUDGET)
    private = GradSampleModule(model)
    opt = DPOptimizer(
        torch.optim.SGD(private.parameters(), lr=cfg.lr),
        noise_multiplier=cfg.noise_multiplier,
        max_grad_norm=cfg.clip,
        expected_batch_size=size,
        generator=gen,
    )
    loss, first = _sgd(private, opt, x, y, batches, physical)
    private._close()
    return TrainResult(
        steps=len(batches),
        loss=loss,
        noise_std=cfg.noise_multiplier * cfg.clip / size,
        sample_rate=size / len(x),
        first_loss=first,
    )


TRAINERS: dict[str, Trainer] = {"fedsgd": train_fedsgd, "fedavg": train_fedavg, "dp": train_dp}


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


def train_locally(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: LocalTraining,
    gen: torch.Generator,
    max_loss_growth: float | None = None,
) -> TrainResult:
    """Train ``model`` in place on (x, y) with the procedure of ``cfg.defence``.

    ``max_loss_growth`` (e.g. :data:`DIVERGENCE_FACTOR`, as a federation's clients use it)
    also counts a loss that blew up as divergence; without it, only non-finite values do (an
    update may be worth studying however bad it is for the model).

    Raises
    ------
    ValueError
        Without samples.
    DivergenceError
        When training diverged (:func:`divergence` says why): the model is then unusable.
    """
    if len(x) == 0:
        raise ValueError("a client needs at least one sample to train on")
    result = TRAINERS[cfg.defence](model, x, y, cfg, gen)
    problem = divergence(model, x, y, result, max_loss_growth)
    if problem is not None:
        raise DivergenceError(f"{cfg.defence} training at lr={cfg.lr:g} diverged: {problem}")
    return result
