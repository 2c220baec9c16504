"""``honest``: the honest-but-curious server, which sends the global model as it is."""

from __future__ import annotations

from typing import Any

import numpy as np

from strategies.behaviours.base import BehaviourSettings, ServerBehaviour, register


class HonestSettings(BehaviourSettings):
    """No settings: the model goes out unchanged."""

    behaviour = "honest"


@register
class Honest(ServerBehaviour):
    """Sends the global model unchanged; recovers what the attacks get from honest training."""

    Settings = HonestSettings
    sends = "the global model unchanged"
    recovers = "what the audit's attacks get from an update of the honest model"

    def first_layer(
        self,
        weight: np.ndarray,
        bias: np.ndarray,
        public: np.ndarray,
        settings: Any,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``weight`` and ``bias`` as they are."""
        return weight, bias
