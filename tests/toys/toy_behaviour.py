"""A toy server behaviour, as a user adds one: this module and its table (``[server.toy]``).

It sends the global model's first layer scaled by its table's ``factor`` (a server that makes
the first layer's pre-activations larger: more of them cross zero for fewer samples)."""

from __future__ import annotations

from typing import Any

import numpy as np

from flsim_plugins.settings import Real
from strategies.behaviours.base import BehaviourSettings, ServerBehaviour, register


class ToySettings(BehaviourSettings):
    behaviour = "toy"
    factor: Real = 2.0


@register
class Toy(ServerBehaviour):
    Settings = ToySettings
    sends = "the first layer scaled by a factor"
    recovers = "what the audit's attacks get from the scaled layer"

    def first_layer(
        self,
        weight: np.ndarray,
        bias: np.ndarray,
        public: np.ndarray,
        settings: Any,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        return settings.factor * weight, settings.factor * bias
