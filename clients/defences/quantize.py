"""``quantize``: stochastic b-bit quantisation of the update, per tensor.

Each tensor of the update u = received - sent is mapped onto 2^b evenly spaced levels between
its own minimum and maximum (both levels, so the range survives) and every entry rounded to one
of its two neighbouring levels at random, up with probability its distance from the lower one
over the step: unbiased, E[q(u)] = u. The server receives sent + q(u).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import numpy as np
from flwr.app import ConfigRecordValues
from pydantic import Field

from clients.defences.base import LR, ArrayUpdateMod, DefenceSettings, Disclosure, register
from flsim_plugins.settings import Int

# What a quantising client declares.
BITS = "quantize-bits"


class QuantizeSettings(DefenceSettings):
    """``bits`` per entry: 2^bits levels per tensor."""

    defence: ClassVar[str] = "quantize"
    bits: Annotated[Int, Field(ge=1, le=32)] = 8


def level_step(low: float, high: float, bits: int) -> float:
    """The distance between two levels of a tensor ranging over [low, high]."""
    return (high - low) / float(2**bits - 1)


def quantize(update: np.ndarray, bits: int, rng: np.random.Generator) -> np.ndarray:
    """One tensor stochastically rounded to 2^bits levels over its own range (float64)."""
    u = update.astype(np.float64)
    if u.size == 0 or u.max() == u.min():
        return u
    low = float(u.min())
    step = level_step(low, float(u.max()), bits)
    scaled = (u - low) / step
    below = np.floor(scaled)
    level = below + (rng.random(u.shape) < scaled - below)
    out: np.ndarray = low + np.clip(level, 0, 2**bits - 1) * step
    return out


@register
class Quantize(ArrayUpdateMod):
    """Stochastic quantisation of the update: what a compressed upload leaves of it."""

    Settings = QuantizeSettings
    order = 30  # last: it quantises what the client uploads

    def transform(
        self, settings: QuantizeSettings, update: list[np.ndarray], rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Each tensor quantised over its own range."""
        return [quantize(u, settings.bits, rng) for u in update]

    def declare(self, settings: QuantizeSettings) -> dict[str, ConfigRecordValues]:
        """The bits per entry."""
        return {BITS: settings.bits}

    def disclose(self, declared: Mapping[str, Any], weight_update: np.ndarray | None) -> Disclosure:
        """The rounding noise the declared bits imply on the first layer's weights: an entry
        at a uniform place between two levels a step s apart errs with variance s^2 / 6,
        here in gradient units (divided by lr). The step is read off the received update's
        own range; before the reply, the level is not known."""
        if weight_update is None or BITS not in declared or weight_update.size == 0:
            return Disclosure(adds_noise=True, noise_std=None)
        step = level_step(
            float(weight_update.min()), float(weight_update.max()), int(declared[BITS])
        )
        return Disclosure(
            adds_noise=True, noise_std=step / math.sqrt(6) / float(declared.get(LR, 1.0))
        )
