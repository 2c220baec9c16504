"""What a defence is, and the registry that holds them.

A defence is one registered class that owns its typed settings (a frozen pydantic model), what it
does, what the client declares of it in its reply (the ``client`` ConfigRecord, under keys named
once, as constants beside it) and what an honest-but-curious server can know of it
(:meth:`Defence.disclose`). There are two kinds:

- a **training** defence (:class:`TrainingDefence`) is the client's local training procedure:
  ``fedsgd``, ``fedavg``, ``dp``; every client has exactly one;
- an **update mod** (:class:`UpdateMod`) is a Flower client mod ``(msg, context, call_next)``
  that transforms the update of a reply: a client has zero or more, applied to its reply in
  the order of their :attr:`Defence.order` (smallest first), whatever order the scenario names
  them in.

Registering is :func:`register` on the class, in its own module of :mod:`clients.defences`,
which imports every module it holds: adding a defence is adding a module.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    ConfigRecordValues,
    Context,
    Message,
    RecordDict,
)
from flwr.clientapp.typing import ClientAppCallable, Mod
from pydantic import AfterValidator, Field, SerializerFunctionWrapHandler, model_serializer
from torch import nn

from clients.reply import ARRAYS, CLIENT
from clients.training import TrainResult
from flsim_plugins import Real, Registry, Settings, ValidationError, explain

# Keys of the reply's ``client`` ConfigRecord that every client declares, for any defence.
DEFENCE = "defence"
LR = "lr"
STEPS = "steps"
BATCH_SIZE = "batch-size"
EPSILON = "epsilon"
# The update mods applied to the reply, in the order they were applied.
UPDATE_MODS = "update-mods"


class DefenceSettings(Settings):
    """A defence's settings; :attr:`defence` is the name it is registered under."""

    defence: ClassVar[str]

    @model_serializer(mode="wrap")
    def _named(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Dumped settings say whose they are (scenario.json, bench results).
        return {"defence": self.defence, **handler(self)}


def _delta(delta: float) -> float:
    if not 0 < delta < 1:
        raise ValueError("must be in (0, 1)")
    return delta


# The delta of a defence's (epsilon, delta) guarantee (DP-SGD's, local DP's), in (0, 1).
Delta = Annotated[Real, AfterValidator(_delta)]


class TrainingSettings(DefenceSettings):
    """Settings every local training procedure has."""

    lr: Annotated[Real, Field(gt=0)] = 0.01


@dataclass(frozen=True)
class Disclosure:
    """What the server may tell the attack of one defence, from what the client declared.

    Attributes
    ----------
    adds_noise
        The defence adds random noise to the update.
    noise_std
        Per-entry std of that noise in gradient units (of (sent - received) / lr, the whole
        update); ``None``: noise of a level the declaration does not give.
    next_layer
        The update is one step, every layer's gradient of the same batch: the next linear
        layer's gradient then fixes each sample's scale under noise of one level far better
        than the first layer's bias gradient alone, and the inputs the first layer leaves open
        where a sample is zero only where others are (worth keeping the reply whole for).
    """

    adds_noise: bool = False
    noise_std: float | None = 0.0
    next_layer: bool = False


class Defence(ABC):
    """A registered defence. Subclasses set :attr:`Settings` and :attr:`order`."""

    Settings: ClassVar[type[DefenceSettings]]
    # Training defences: the order they are listed in; update mods: the order they are
    # applied to a reply (DP noise first, then what only post-processes it).
    order: ClassVar[int]

    @property
    def name(self) -> str:
        """The name the scenario and the reply use."""
        return self.Settings.defence

    def disclose(self, declared: Mapping[str, Any], weight_update: np.ndarray | None) -> Disclosure:
        """The server's knowledge rule: what the attack may be told of this defence, given the
        client's declaration and, once the reply came, the first layer's weight update
        (received - sent; ``None`` before). By default: nothing (no noise)."""
        return Disclosure()


class TrainingDefence(Defence):
    """A local training procedure."""

    Settings: ClassVar[type[TrainingSettings]]

    @abstractmethod
    def train(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        settings: Any,
        generator: torch.Generator,
    ) -> TrainResult:
        """Train ``model`` in place on (x, y); ``settings`` is an instance of :attr:`Settings`."""

    @abstractmethod
    def declare(self, settings: Any, batch_size: int) -> dict[str, ConfigRecordValues]:
        """What the client declares of its training before it trains (also in a failed reply)."""

    def spend(
        self, settings: Any, result: TrainResult, state: RecordDict
    ) -> dict[str, ConfigRecordValues]:
        """What the client declares after training (privacy spent, kept in ``state`` across
        rounds); by default nothing."""
        return {}


class UpdateMod(Defence):
    """A Flower client mod that transforms the update of a successful reply."""

    @abstractmethod
    def mod(self, settings: Any, seed: int) -> Mod:
        """The mod for one client's round: ``settings`` is an instance of :attr:`Settings`,
        ``seed`` seeds its randomness. It leaves failed replies (no arrays) as they are and
        appends its name to the reply's :data:`UPDATE_MODS`."""


def declared_count(declared: Mapping[str, Any], key: str) -> int | None:
    """A count a client declares (``steps``, ``batch-size``), if it is a positive integer: a
    user's own app may send anything, or nothing."""
    try:
        count = int(declared[key])
    except (KeyError, TypeError, ValueError):
        return None
    return count if count > 0 else None


def declared_rate(declared: Mapping[str, Any], key: str) -> float | None:
    """A positive, finite number a client declares (``lr``), if it is one."""
    try:
        value = float(declared[key])
    except (KeyError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def declared_id(declared: Mapping[str, Any], key: str, default: int) -> int:
    """An integer id a client declares (``partition-id``), or ``default`` where it sent none
    or something else."""
    try:
        return int(declared[key])
    except (KeyError, TypeError, ValueError):
        return default


def released(reply: Message) -> bool:
    """Whether a reply carries an update (a failed round's reply has no arrays)."""
    return not reply.has_error() and isinstance(reply.content.get(ARRAYS), ArrayRecord)


def declare_mod(reply: Message, name: str, keys: Mapping[str, ConfigRecordValues]) -> None:
    """Add an update mod's declaration to the reply's ``client`` record and its name to
    :data:`UPDATE_MODS`."""
    record = reply.content.get(CLIENT)
    if not isinstance(record, ConfigRecord):
        raise ValueError(f"the reply has no ConfigRecord {CLIENT!r} to declare {name!r} in")
    applied = record.get(UPDATE_MODS, [])
    record[UPDATE_MODS] = [*(applied if isinstance(applied, list) else []), name]
    for key, value in keys.items():
        record[key] = value


class ArrayUpdateMod(UpdateMod):
    """An update mod that rewrites the update (received - sent) tensor by tensor."""

    @abstractmethod
    def transform(
        self, settings: Any, update: list[np.ndarray], rng: np.random.Generator
    ) -> list[np.ndarray]:
        """The update the server is to receive, one array per array of ``update``."""

    @abstractmethod
    def declare(self, settings: Any) -> dict[str, ConfigRecordValues]:
        """What the client declares of this mod."""

    def mod(self, settings: Any, seed: int) -> Mod:
        """Replace the reply's arrays by sent + :meth:`transform` (received - sent)."""

        def apply(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
            reply = call_next(msg, context)
            if not released(reply):
                return reply
            sent, received = msg.content[ARRAYS], reply.content[ARRAYS]
            if not (isinstance(sent, ArrayRecord) and isinstance(received, ArrayRecord)):
                raise ValueError(f"{self.name}: the message and its reply need {ARRAYS!r}")
            keys = list(received.keys())
            before = [sent[k].numpy() for k in keys]
            update = [received[k].numpy() - b for k, b in zip(keys, before, strict=True)]
            rng = np.random.default_rng([seed, self.order])
            changed = self.transform(settings, update, rng)
            reply.content[ARRAYS] = ArrayRecord(
                {
                    k: Array((b + u).astype(b.dtype))
                    for k, b, u in zip(keys, before, changed, strict=True)
                }
            )
            declare_mod(reply, self.name, self.declare(settings))
            return reply

        return apply


DEFENCES: Registry[Defence] = Registry("defence", key="defence")
# Class decorator: one instance of the class, registered under its settings' name.
register = DEFENCES.instance


def training_defences() -> dict[str, TrainingDefence]:
    """The training defences, in their order."""
    found = [d for d in DEFENCES.values() if isinstance(d, TrainingDefence)]
    return {d.name: d for d in sorted(found, key=lambda d: d.order)}


def update_mods() -> dict[str, UpdateMod]:
    """The update mods, in the order they are applied to a reply."""
    found = [d for d in DEFENCES.values() if isinstance(d, UpdateMod)]
    return {d.name: d for d in sorted(found, key=lambda d: d.order)}


def training_settings(defence: str = "fedsgd", **settings: Any) -> TrainingSettings:
    """Validated settings of the training defence ``defence``.

    Raises
    ------
    ValueError
        For an unknown defence or a bad setting; the message names the key, the value and what
        is allowed (``lr=0.0: must be > 0``).
    """
    known = training_defences()
    if defence not in known:
        raise ValueError(f"defence={defence!r}: allowed are {', '.join(known)}")
    cls = known[defence].Settings
    try:
        return cls.model_validate(settings)
    except ValidationError as err:
        raise ValueError(explain(err, cls, sep="=")) from None


def declared_defences(declared: Mapping[str, Any]) -> list[Defence]:
    """The registered defences a reply declares: its training defence, then its update mods."""
    names = [str(declared.get(DEFENCE, "")), *(str(n) for n in declared.get(UPDATE_MODS, []))]
    return [DEFENCES[n] for n in names if n in DEFENCES]


# The label of a client that says nothing of its defence (a Flower app of one's own): what is
# known is that it did not declare one, not that it has none.
UNDECLARED = "undeclared"


def defence_label(declared: Mapping[str, Any]) -> str:
    """How records and reports name a client's defences: ``fedsgd``, ``fedsgd+topk``;
    ``undeclared`` for a client that declares none."""
    names = [str(declared.get(DEFENCE, UNDECLARED)), *map(str, declared.get(UPDATE_MODS, []))]
    return "+".join(names)


def combined_noise(parts: list[Disclosure], rounding: float) -> float:
    """Per-entry std of independent noises together with the weights' rounding noise."""
    return math.hypot(*(p.noise_std or 0.0 for p in parts), rounding)
