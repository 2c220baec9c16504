"""Step 2: batched multi-start minimisation of a sparsity surrogate of L q over the unit sphere.

Starts are rows of one (K x B) tensor on the sphere, so every step is two dense products of the
m x B factor with K directions: the GPU-friendly part of the attack. The search never leaves the
device; the host sees the points only when they are harvested.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import geoopt
import torch

from attacks.spearpp.config import SpearConfig
from attacks.spearpp.surrogates import surrogate_grad

SPHERE = geoopt.Sphere()

# Called with the live points; returns the mask of points to keep searching.
Harvest = Callable[[torch.Tensor], torch.Tensor]


class Stepper(Protocol):
    """A batch of points on the sphere and an optimiser that moves them."""

    @property
    def points(self) -> torch.Tensor:
        """The live points, K x B."""

    def step(self, egrad: torch.Tensor, lr: float) -> None:
        """Move every point along the Riemannian version of its Euclidean gradient."""

    def keep(self, mask: torch.Tensor) -> None:
        """Drop the points (and their optimiser state) where ``mask`` is False."""


class RiemannianAdamStepper:
    """geoopt's Riemannian Adam on K points of the unit sphere."""

    def __init__(self, start: torch.Tensor) -> None:
        self._param = geoopt.ManifoldParameter(start, manifold=SPHERE)
        self._opt = geoopt.optim.RiemannianAdam([self._param], lr=1.0)

    @property
    def points(self) -> torch.Tensor:
        points: torch.Tensor = self._param.data
        return points

    def step(self, egrad: torch.Tensor, lr: float) -> None:
        self._param.grad = egrad
        for group in self._opt.param_groups:
            group["lr"] = lr
        self._opt.step()

    def keep(self, mask: torch.Tensor) -> None:
        state = self._opt.state.get(self._param, {})
        self._param = geoopt.ManifoldParameter(self._param.data[mask].clone(), manifold=SPHERE)
        self._opt = geoopt.optim.RiemannianAdam([self._param], lr=1.0)
        if state:
            self._opt.state[self._param] = {
                k: v[mask].clone() if isinstance(v, torch.Tensor) and v.ndim else v
                for k, v in state.items()
            }


class ProjectedGradientStepper:
    """Projected gradient descent: a step of length ``lr`` along the tangent gradient, then back
    onto the sphere (normalised steps, since the l1 gradient's size says nothing about distance)."""

    def __init__(self, start: torch.Tensor) -> None:
        self.points = start

    def step(self, egrad: torch.Tensor, lr: float) -> None:
        tangent = SPHERE.proju(self.points, egrad)
        norm = tangent.norm(dim=1, keepdim=True).clamp_min(torch.finfo(tangent.dtype).tiny)
        self.points = SPHERE.retr(self.points, -lr * tangent / norm)

    def keep(self, mask: torch.Tensor) -> None:
        self.points = self.points[mask]


STEPPERS: dict[str, Callable[[torch.Tensor], Stepper]] = {
    "radam": RiemannianAdamStepper,
    "pgd": ProjectedGradientStepper,
}


def random_starts(count: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` points drawn uniformly on the unit sphere of R^dim (float64, CPU)."""
    x = torch.randn(count, dim, generator=generator, dtype=torch.float64)
    return torch.nn.functional.normalize(x, dim=1)


def learning_rate(config: SpearConfig, step: int) -> float:
    """Geometric decay from ``lr`` at the first step to ``lr_final`` at the last."""
    if config.steps == 1:
        return config.lr
    return config.lr * math.exp(math.log(config.lr_final / config.lr) * step / (config.steps - 1))


def run_search(
    left: torch.Tensor, starts: torch.Tensor, config: SpearConfig, harvest: Harvest
) -> torch.Tensor:
    """Minimise the surrogate from each start; returns the points still live after the last step.

    Parameters
    ----------
    left
        The m x B factor, in the search dtype, on the search device.
    starts
        K x B unit directions (any dtype and device: moved to ``left``'s).
    config
        Surrogate, optimiser, steps, learning rates and the harvest period.
    harvest
        Called every ``config.harvest_every`` steps with the live points; points it does not keep
        stop searching (they were taken as candidates, or head for a column already found).
    """
    grad_of = surrogate_grad(config.surrogate, left.shape[0], config.logcosh_mu)
    # A copy: the optimiser moves its points in place, and the caller's starts stay as given.
    start = starts.to(device=left.device, dtype=left.dtype, copy=True)
    stepper: Stepper = STEPPERS[config.optimiser](start)
    for step in range(config.steps):
        if config.harvest_every and step and step % config.harvest_every == 0:
            stepper.keep(harvest(stepper.points))
            if stepper.points.shape[0] == 0:
                break
        y = stepper.points @ left.T
        stepper.step(grad_of(y) @ left, learning_rate(config, step))
    return stepper.points
