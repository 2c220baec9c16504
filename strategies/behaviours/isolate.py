"""``isolate``: model inconsistency under secure aggregation (Pasquini et al., "Eluding Secure
Aggregation in Federated Learning via Model Inconsistency").

Secure aggregation hands the server only the sum of the cohort's updates, and one client's
batch is lost among everyone's. A server that sends different models to different clients
undoes that: the target client gets the honest model, every other client one whose first layer
never fires (zero weights, negative biases: each neuron's pre-activation is its bias whatever
the input), so a ReLU network's gradient of that layer is exactly zero for each of their
samples. The first layer of the sum SecAgg+ unmasks is then the target's update alone (scaled
by its share of the cohort's examples, with the quantisation noise of every client), and
SPEAR++ recovers its batch as if there were no secure aggregation.

The server tells the target's node by what every client declares in the clear, beside its
masked vector (its partition id, in its fit metrics): until it has seen it, after the first
round, it sends every node the honest model. Without secure aggregation the server sees every
update anyway; there the behaviour only silences the other clients' first layers, at their
training's cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from flsim_plugins.settings import Int
from strategies.behaviours.base import BehaviourSettings, ServerBehaviour, register

# Any negative bias kills a neuron whose weights are zero; -1 stays far inside SecAgg+'s
# clipping range once the client's num-examples / max_weight scales it.
DEAD_BIAS = -1.0


class IsolateSettings(BehaviourSettings):
    """``target``: the partition id of the client whose batch the server isolates."""

    behaviour = "isolate"
    target: Annotated[Int, Field(ge=0)] = 0


@register
class Isolate(ServerBehaviour):
    """The honest model to the target client, a dead first layer to every other one."""

    Settings = IsolateSettings
    sends = (
        "the global model to the target client; to every other client a first layer that never "
        "fires (zero weights, bias -1), whose update of it is zero"
    )
    recovers = "the target client's batch from the SecAgg+ sum's first layer, by SPEAR++"
    per_client = True

    def first_layer(
        self,
        weight: np.ndarray,
        bias: np.ndarray,
        public: np.ndarray,
        settings: Any,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The target's layer: ``weight`` and ``bias`` as they are."""
        return weight, bias

    def layers(
        self,
        clients: Sequence[int | None],
        weight: np.ndarray,
        bias: np.ndarray,
        public: np.ndarray,
        settings: Any,
        rng: np.random.Generator,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The honest layer to the target and to nodes not yet told apart, the dead one to
        every other client."""
        dead = (np.zeros_like(weight), np.full_like(bias, DEAD_BIAS))
        honest = self.first_layer(weight, bias, public, settings, rng)
        return [honest if c is None or c == settings.target else dead for c in clients]

    def refuses(self, settings: Any, clients: int) -> str | None:
        """Refused for a target outside the clients."""
        if settings.target >= clients:
            return (
                f"server.{self.name}.target = {settings.target}: the clients are 0..{clients - 1}"
            )
        return None
