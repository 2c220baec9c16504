"""``local_dp``: Flower's own local DP mod, :class:`flwr.clientapp.mod.LocalDpMod`, per client.

What Flower 1.42's mod does (read off its source): it clips the update (received - sent) to L2
norm ``clipping_norm`` over all arrays at once, then adds Gaussian noise of std
``sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon`` (the classical Gaussian mechanism, whose
bound holds for epsilon < 1) to every entry of the weights it returns, i.e. of the update. It
draws that noise from numpy's global generator: fl-sim seeds it for the call from the client's
round seed (and restores it after), so runs are reproducible.

Its (epsilon, delta) is per round and Flower composes nothing. fl-sim keeps the rounds each
client released in its persistent state and declares the total by basic composition: the sum
of the rounds' epsilons and the sum of their deltas. The reply's ``epsilon`` (the client's
privacy spent, as the report shows it) adds that total to the training defence's own (DP-SGD's
RDP epsilon at its delta): basic composition again.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, ClassVar

import numpy as np
from flwr.app import ConfigRecord, ConfigRecordValues, Context, Message
from flwr.clientapp.mod import LocalDpMod
from flwr.clientapp.typing import ClientAppCallable, Mod
from pydantic import Field

from clients.defences.base import (
    EPSILON,
    LR,
    STEPS,
    DefenceSettings,
    Delta,
    Disclosure,
    UpdateMod,
    declare_mod,
    register,
    released,
)
from clients.reply import CLIENT
from flsim_plugins.settings import Real

# What a local-DP client declares: the mechanism's settings, the round's (epsilon, delta) and
# the totals so far.
CLIPPING_NORM = "local-dp-clipping-norm"
SENSITIVITY = "local-dp-sensitivity"
ROUND_EPSILON = "local-dp-epsilon"
ROUND_DELTA = "local-dp-delta"
TOTAL_EPSILON = "local-dp-epsilon-total"
TOTAL_DELTA = "local-dp-delta-total"
# The rounds released so far, in the client's persistent state.
LEDGER = "local-dp-ledger"


class LocalDpSettings(DefenceSettings):
    """Flower's ``LocalDpMod(clipping_norm, sensitivity, epsilon, delta)``, per round."""

    defence: ClassVar[str] = "local_dp"
    clipping_norm: Annotated[Real, Field(gt=0)] = 1.0
    sensitivity: Annotated[Real, Field(gt=0)] = 1.0
    epsilon: Annotated[Real, Field(gt=0)] = 1.0
    delta: Delta = 1e-5

    def noise_std(self) -> float:
        """Per-entry std of the noise LocalDpMod adds to the weights (update units)."""
        return gaussian_std(self.sensitivity, self.epsilon, self.delta)


def gaussian_std(sensitivity: float, epsilon: float, delta: float) -> float:
    """The std LocalDpMod computes: sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon."""
    return sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


@contextmanager
def seeded_numpy(seed: int) -> Iterator[None]:
    """numpy's global generator seeded with ``seed`` inside, as it was outside."""
    kept = np.random.get_state()
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        np.random.set_state(kept)


@register
class LocalDp(UpdateMod):
    """Local DP: the update clipped and noised on the client by Flower's LocalDpMod."""

    Settings = LocalDpSettings
    order = 10  # first: what follows only post-processes the private update

    def mod(self, settings: LocalDpSettings, seed: int) -> Mod:
        """LocalDpMod on a released reply, seeded; the round's and total privacy declared."""
        flower = LocalDpMod(
            settings.clipping_norm, settings.sensitivity, settings.epsilon, settings.delta
        )

        def apply(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
            reply = call_next(msg, context)
            if not released(reply):  # a failed round releases nothing and spends nothing
                return reply
            with seeded_numpy(seed + self.order):
                noised = flower(msg, context, lambda m, c: reply)
            if noised.has_error():
                return noised
            epsilons, deltas = _spend(context, settings)
            record = noised.content[CLIENT]
            before = float(record.get(EPSILON, 0.0)) if isinstance(record, ConfigRecord) else 0.0  # type: ignore[arg-type]
            keys: dict[str, ConfigRecordValues] = {
                CLIPPING_NORM: settings.clipping_norm,
                SENSITIVITY: settings.sensitivity,
                ROUND_EPSILON: settings.epsilon,
                ROUND_DELTA: settings.delta,
                TOTAL_EPSILON: sum(epsilons),
                TOTAL_DELTA: sum(deltas),
                EPSILON: before + sum(epsilons),
            }
            declare_mod(noised, self.name, keys)
            return noised

        return apply

    def disclose(self, declared: Mapping[str, Any], weight_update: np.ndarray | None) -> Disclosure:
        """The Gaussian noise the declared (sensitivity, epsilon, delta) imply, once on the
        update, in gradient units (divided by lr); one step: the next layer fixes scales."""
        try:
            std = gaussian_std(
                float(declared[SENSITIVITY]),
                float(declared[ROUND_EPSILON]),
                float(declared[ROUND_DELTA]),
            )
        except (KeyError, ValueError, ZeroDivisionError):
            return Disclosure(adds_noise=True, noise_std=None)
        return Disclosure(
            adds_noise=True,
            noise_std=std / float(declared.get(LR, 1.0)),
            next_layer=int(declared.get(STEPS, 0)) == 1,
        )


def _spend(context: Context, settings: LocalDpSettings) -> tuple[list[float], list[float]]:
    """The (epsilon, delta) of every round released so far, this one included, as kept in
    the client's state."""
    kept = context.state.get(LEDGER)
    epsilons: list[float] = []
    deltas: list[float] = []
    if isinstance(kept, ConfigRecord):
        epsilons = [float(e) for e in kept["epsilon"]]  # type: ignore[union-attr]
        deltas = [float(d) for d in kept["delta"]]  # type: ignore[union-attr]
    epsilons.append(settings.epsilon)
    deltas.append(settings.delta)
    context.state[LEDGER] = ConfigRecord({"epsilon": epsilons, "delta": deltas})
    return epsilons, deltas
