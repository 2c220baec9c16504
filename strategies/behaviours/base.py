"""What a server behaviour is, and the registry that holds them.

A behaviour decides what the server sends: the global model as it is (``honest``, the
honest-but-curious server) or one whose first layer it has shaped so that a client's update
gives more of its batch away (``sparsify``, ``trap``). It is one registered class that owns its
typed settings (a frozen pydantic model) and says, in words, what it sends and what it
recovers. :class:`strategies.Tampering` is the strategy wrapper that applies it: the global
model is still aggregated honestly, only the copy sent for training is tampered with.

Registering is :func:`register` on the class, in its own module of
:mod:`strategies.behaviours`, which imports every module it holds: adding a behaviour is adding
a module.

A behaviour sends one model to every client unless it overrides :meth:`ServerBehaviour.layers`,
which gives the layer for each client: model inconsistency under secure aggregation
(``isolate``: the target client gets the honest model, every other client one whose first layer
never fires, so their first-layer updates are zero and the sum SecAgg+ hands the server is the
target's alone). Per-client models are sent where the messages are made, under either of
Flower's server APIs (:class:`strategies.core.ServerCore` asks the behaviour; the Message API's
:class:`strategies.Tampering` and, under SecAgg+, the legacy
:class:`strategies.legacy.LegacyTampering` carry its layers). A behaviour that only makes sense
in some scenarios says why in :meth:`ServerBehaviour.refuses`, which the scenario's validation
asks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import SerializerFunctionWrapHandler, model_serializer

from flsim_plugins import Registry, Settings, ValidationError, explain

# What the scenario names the behaviour by.
BEHAVIOUR = "behaviour"


class BehaviourSettings(Settings):
    """A behaviour's settings; :attr:`behaviour` is the name it is registered under."""

    behaviour: ClassVar[str]

    @model_serializer(mode="wrap")
    def _named(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Dumped settings say whose they are (scenario.json).
        return {BEHAVIOUR: self.behaviour, **handler(self)}


class ServerBehaviour(ABC):
    """A registered server behaviour. Subclasses set :attr:`Settings`, :attr:`sends` and
    :attr:`recovers`."""

    Settings: ClassVar[type[BehaviourSettings]]
    # In words, for the docs and the report.
    sends: ClassVar[str]
    recovers: ClassVar[str]
    # Whether it sends clients different layers (overrides :meth:`layers`): Flower's central
    # DP wrappers clip every update against one model, so such a behaviour runs without them.
    per_client: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """The name the scenario and the records use."""
        return self.Settings.behaviour

    @abstractmethod
    def first_layer(
        self,
        weight: np.ndarray,
        bias: np.ndarray,
        public: np.ndarray,
        settings: Any,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The first layer to send in place of the global model's (``weight`` m x n, ``bias``
        m).

        Parameters
        ----------
        weight, bias
            The global model's first layer.
        public
            Inputs the server holds itself (N x n, as the first layer takes them): its own
            statistics of the data, never a client's.
        settings
            An instance of :attr:`Settings`.
        rng
            The round's randomness.
        """

    def layers(
        self,
        clients: Sequence[int | None],
        weight: np.ndarray,
        bias: np.ndarray,
        public: np.ndarray,
        settings: Any,
        rng: np.random.Generator,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The first layer to send to each of ``clients`` (their partition ids, ``None`` for a
        node the server cannot yet tell), in their order; the other parameters as
        :meth:`first_layer` takes them. By default every client gets :meth:`first_layer`'s."""
        layer = self.first_layer(weight, bias, public, settings, rng)
        return [layer] * len(clients)

    def refuses(self, settings: Any, clients: int) -> str | None:
        """Why the behaviour cannot run with ``settings`` in a scenario of ``clients`` clients
        (naming the key at fault); ``None`` when it can, as by default."""
        return None


BEHAVIOURS: Registry[ServerBehaviour] = Registry("server behaviour", key="behaviour")
# Class decorator: one instance of the class, registered under its settings' name.
register = BEHAVIOURS.instance


def behaviour_settings(behaviour: str = "honest", **settings: Any) -> BehaviourSettings:
    """Validated settings of the behaviour ``behaviour``.

    Raises
    ------
    ValueError
        For an unknown behaviour or a bad setting; the message names the key, the value and
        what is allowed.
    """
    cls = BEHAVIOURS.lookup(behaviour).Settings
    try:
        return cls.model_validate(settings)
    except ValidationError as err:
        raise ValueError(explain(err, cls, sep="=")) from None


def firing_bias(weight: np.ndarray, public: np.ndarray, share: float) -> np.ndarray:
    """Biases (m) with which each neuron of ``weight`` (m x n) fires for ``share`` of the
    ``public`` inputs (N x n): minus each neuron's (1 - share) quantile of ``weight @ x``."""
    # The product in torch, not numpy: this runs in the ServerApp's thread, where OpenBLAS's
    # threaded matmul (numpy's) was seen to hang for good beside Ray; torch's is the one the
    # rest of the run uses.
    pre = (torch.from_numpy(public).double() @ torch.from_numpy(weight).double().T).numpy()
    bias: np.ndarray = -np.quantile(pre, 1.0 - share, axis=0)
    return bias
