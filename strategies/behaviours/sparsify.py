"""``sparsify``: the global model's first-layer weights with its biases shifted so that each
neuron fires for a small share of samples.

A sample's column of the first layer's gradient is zero wherever it leaves a neuron off;
SPEAR++ searches for exactly such sparse columns, and the sparser they are the larger the batch
it reaches. The server sets each bias to minus the neuron's (1 - share) quantile of its
pre-activation over data of its own (its test set), so each neuron fires for about ``share`` of
any batch drawn alike.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import Field

from flsim_plugins.settings import Real
from strategies.behaviours.base import (
    BehaviourSettings,
    ServerBehaviour,
    firing_bias,
    register,
)


class SparsifySettings(BehaviourSettings):
    """``share``: the share of samples each neuron is to fire for (honest: about 0.5)."""

    behaviour = "sparsify"
    share: Annotated[Real, Field(gt=0, lt=1)] = 0.1


@register
class Sparsify(ServerBehaviour):
    """Shifts the first layer's biases, keeping its weights."""

    Settings = SparsifySettings
    sends = "the global model with the first layer's biases shifted to fire for `share` of samples"
    recovers = "SPEAR++ on sparser activation gradients: larger batches exactly"

    def first_layer(
        self,
        weight: np.ndarray,
        bias: np.ndarray,
        public: np.ndarray,
        settings: Any,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``weight`` as it is; the biases that fire each neuron for ``settings.share``."""
        return weight, firing_bias(weight, public, settings.share).astype(bias.dtype)
