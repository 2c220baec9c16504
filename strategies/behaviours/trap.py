"""``trap``: trap weights (Boenisch et al., "When the Curious Abandon Honesty"): a first layer
crafted so that most neurons fire for one sample of a batch, which the update then gives away
exactly, x_i = dL/dW_j / dL/db_j (:func:`attacks.spearpp.isolate.isolated_samples`).

Each row keeps the global model's weight magnitudes with random signs, the negative half scaled
by ``negative_scale`` (the paper's trap: most inputs then land below zero), and its bias is set
from the server's own data so the neuron fires for 1 / ``batch_size`` of samples: a neuron then
fires for exactly one sample of a batch of that size with probability (1 - 1/B)^(B-1), about
1/e, the most any single threshold achieves.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import Field

from flsim_plugins.settings import Int, Real
from strategies.behaviours.base import (
    BehaviourSettings,
    ServerBehaviour,
    firing_bias,
    register,
)


class TrapSettings(BehaviourSettings):
    """``batch_size``: the batch size the trap is laid for; ``negative_scale``: the factor of
    each row's negative weights."""

    behaviour = "trap"
    batch_size: Annotated[Int, Field(ge=2)] = 64
    negative_scale: Annotated[Real, Field(gt=0)] = 1.0


@register
class Trap(ServerBehaviour):
    """Replaces the first layer by trap weights."""

    Settings = TrapSettings
    sends = "a first layer of trap weights, each neuron firing for 1 / batch_size of samples"
    recovers = "each sample a neuron fires for alone, exactly, by x = dW_j / db_j; SPEAR++ too"

    def first_layer(
        self,
        weight: np.ndarray,
        bias: np.ndarray,
        public: np.ndarray,
        settings: Any,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of random signs (half negative, scaled) on ``weight``'s magnitudes; biases
        that fire each for 1 / ``settings.batch_size`` of the server's data."""
        m, n = weight.shape
        half = np.tile(np.arange(n) < n // 2, (m, 1))
        negative = rng.permuted(half, axis=1)
        trap = np.abs(weight) * np.where(negative, -settings.negative_scale, 1.0)
        trap = trap.astype(weight.dtype)
        return trap, firing_bias(trap, public, 1.0 / settings.batch_size).astype(bias.dtype)
