"""What every attack is handed: one client update as the server holds it (:class:`ServerView`),
and the first layer's observation and batch-size estimate the first-layer attacks share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attacks.errors import AttackInputError
from attacks.spearpp.factor import factorise
from attacks.spearpp.inputs import LayerObservation, NextArrays, observe_layer


@dataclass(frozen=True)
class ServerView:
    """One client update as the honest-but-curious server holds it, and what it may use.

    Attributes
    ----------
    weights
        Arrays as the server sent them, by ArrayRecord key: the first layer's for first-layer
        attacks, every array for whole-model ones.
    gradient
        The update turned into a gradient, same keys.
    first_layer
        Keys of the first linear layer's weight and bias.
    next_layer
        Keys of the next linear layer's weight and bias, when ``gradient`` holds them: given only
        for one-step updates, whose next-layer gradient is one batch gradient.
    architecture
        The model the server built (weights not used; ``meta`` is fine); whole-model attacks
        need it.
    input_shape
        One sample's shape as the model takes it.
    batch_size
        The batch size, if the client declared it and the attacker may use it.
    noise_std
        Per-entry std of noise in ``gradient`` (DP, rounding), if known.
    labels
        The batch's labels, if the attacker is told them.
    bounds
        Per-channel lower and upper input values (the server's input pipeline), if known.
    """

    weights: Mapping[str, np.ndarray]
    gradient: Mapping[str, np.ndarray]
    first_layer: tuple[str, str]
    next_layer: tuple[str, str] | None = None
    architecture: nn.Module | None = None
    input_shape: tuple[int, ...] = (3, 32, 32)
    batch_size: int | None = None
    noise_std: float | None = None
    labels: tuple[int, ...] | None = None
    bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None


def first_layer(view: ServerView, device: torch.device) -> LayerObservation:
    """The first layer's gradient and weights as SPEAR++ observes them."""
    w_key, b_key = view.first_layer
    nxt: NextArrays | None = None
    if view.next_layer is not None:
        missing = [k for k in view.next_layer if k not in view.gradient]
        if missing:
            raise AttackInputError(f"the next layer's gradient lacks arrays {missing}")
        grads = (view.gradient[view.next_layer[0]], view.gradient[view.next_layer[1]])
        sent = view.weights.get(view.next_layer[0])
        nxt = grads if sent is None else (*grads, sent)
    return observe_layer(
        view.gradient[w_key],
        view.gradient[b_key],
        view.weights[w_key],
        view.weights[b_key],
        device,
        nxt,
    )


def estimate_batch_size(view: ServerView, seed: int = 0) -> tuple[int, str]:
    """B from the first layer's gradient rank (SPEAR++'s estimate), unless declared."""
    if view.batch_size is not None:
        return view.batch_size, "declared"
    obs = first_layer(view, torch.device("cpu"))
    fac = factorise(
        obs.grad_weight,
        batch_size=None,
        noise_std=view.noise_std,
        precision=obs.precision,
        generator=torch.Generator().manual_seed(seed),
    )
    if fac.batch_size < 1:
        raise AttackInputError("no sample stands above the noise in the first layer's gradient")
    return fac.batch_size, fac.method
