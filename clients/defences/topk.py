"""``topk``: top-k sparsification of the update, the k largest-magnitude entries kept.

Of the update u = received - sent the client keeps the k = ceil(share x n) entries of largest
magnitude, per tensor (n its entries) or over the whole model (n all entries), and zeroes the
rest: the server receives sent + u on those entries and sent elsewhere. Ties at the k-th
magnitude are broken by position, so exactly k entries survive.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

import numpy as np
from flwr.app import ConfigRecordValues
from pydantic import Field

from clients.defences.base import ArrayUpdateMod, DefenceSettings, register
from flsim_plugins.settings import Real

# What a sparsifying client declares.
SHARE = "topk-share"
SCOPE = "topk-scope"


class TopKSettings(DefenceSettings):
    """``share`` in (0, 1] of the entries kept, counted per ``tensor`` or over the ``model``."""

    defence: ClassVar[str] = "topk"
    share: Annotated[Real, Field(gt=0, le=1)] = 0.1
    scope: Literal["tensor", "model"] = "tensor"


def keep_largest(values: np.ndarray, share: float) -> np.ndarray:
    """``values`` with all but its ceil(share x n) largest-magnitude entries zeroed."""
    flat = values.reshape(-1)
    k = math.ceil(share * flat.size)
    kept = np.zeros_like(flat)
    if k:
        # Stable sort by magnitude, largest first: exactly k entries, ties by position.
        top = np.argsort(-np.abs(flat), kind="stable")[:k]
        kept[top] = flat[top]
    return kept.reshape(values.shape)


@register
class TopK(ArrayUpdateMod):
    """Top-k sparsification of the update: what a compressed upload keeps of it."""

    Settings = TopKSettings
    order = 20  # after local DP's noise (it post-processes it), before quantisation

    def transform(
        self, settings: TopKSettings, update: list[np.ndarray], rng: np.random.Generator
    ) -> list[np.ndarray]:
        """The largest entries of each tensor, or of all of them together."""
        if settings.scope == "tensor":
            return [keep_largest(u, settings.share) for u in update]
        sizes = np.cumsum([u.size for u in update])[:-1]
        whole = keep_largest(np.concatenate([u.reshape(-1) for u in update]), settings.share)
        return [
            part.reshape(u.shape) for part, u in zip(np.split(whole, sizes), update, strict=True)
        ]

    def declare(self, settings: TopKSettings) -> dict[str, ConfigRecordValues]:
        """The share kept and what it is counted over."""
        return {SHARE: settings.share, SCOPE: settings.scope}
