"""Sparsity surrogates of ||L q||_0, by name; each maps Y = Q L^T to dLoss/dY.

Only gradients are needed: the search steps on them and never evaluates the loss itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

SurrogateGrad = Callable[[torch.Tensor, float], torch.Tensor]


def _l1(y: torch.Tensor, mu: float) -> torch.Tensor:
    return torch.sign(y)


def _logcosh(y: torch.Tensor, mu: float) -> torch.Tensor:
    # d/dy mu log cosh(y / mu) = tanh(y / mu)
    return torch.tanh(y / mu)


def _neg_l4(y: torch.Tensor, mu: float) -> torch.Tensor:
    return -4.0 * y.pow(3)


SURROGATES: dict[str, SurrogateGrad] = {"l1": _l1, "logcosh": _logcosh, "l4": _neg_l4}


def surrogate_grad(
    name: str, width: int, mu_relative: float
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The gradient of surrogate ``name`` for a layer of ``width`` neurons.

    ``mu_relative`` scales LogCosh's smoothing to the typical entry 1/sqrt(m) of a unit L q.
    """
    fn = SURROGATES[name]
    mu = mu_relative / math.sqrt(width)
    return lambda y: fn(y, mu)
