"""The attacks by name, each behind one signature: what the server holds in, a reconstruction out.

The audit picks attacks from :data:`ATTACKS` by the names its config lists; adding an attack is
one registration here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.analytic import AnalyticConfig, run_analytic
from attacks.errors import AttackInputError
from attacks.inversion import InversionConfig, invert_gradients
from attacks.result import Reconstruction
from attacks.spearpp import SpearConfig, run_spearpp
from attacks.spearpp.factor import factorise
from attacks.spearpp.inputs import LayerObservation, observe_layer, resolve_device
from flsim_plugins import Registry


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


@dataclass(frozen=True)
class RegisteredAttack:
    """An attack as the audit sees it.

    Attributes
    ----------
    name
        Registry key.
    config_type
        Its settings' class.
    whole_model
        Needs every array of the update and the architecture (else the first layer suffices).
    run
        ``run(view, config) -> Reconstruction``.
    """

    name: str
    config_type: type
    whole_model: bool
    run: Callable[[ServerView, Any], Reconstruction]


def _first_layer(view: ServerView, device: torch.device) -> LayerObservation:
    """The first layer's gradient and weights as SPEAR++ observes them."""
    w_key, b_key = view.first_layer
    nxt = None
    if view.next_layer is not None:
        missing = [k for k in view.next_layer if k not in view.gradient]
        if missing:
            raise AttackInputError(f"the next layer's gradient lacks arrays {missing}")
        nxt = (view.gradient[view.next_layer[0]], view.gradient[view.next_layer[1]])
    return observe_layer(
        view.gradient[w_key],
        view.gradient[b_key],
        view.weights[w_key],
        view.weights[b_key],
        device,
        nxt,
    )


def _spearpp(view: ServerView, config: SpearConfig) -> Reconstruction:
    obs = _first_layer(view, resolve_device(config.device))
    return run_spearpp(obs, batch_size=view.batch_size, noise_std=view.noise_std, config=config)


def estimate_batch_size(view: ServerView, seed: int = 0) -> tuple[int, str]:
    """B from the first layer's gradient rank (SPEAR++'s estimate), unless declared."""
    if view.batch_size is not None:
        return view.batch_size, "declared"
    obs = _first_layer(view, torch.device("cpu"))
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


def _analytic(view: ServerView, config: AnalyticConfig) -> Reconstruction:
    return run_analytic(_first_layer(view, torch.device("cpu")), config)


def _inversion(view: ServerView, config: InversionConfig) -> Reconstruction:
    if view.architecture is None:
        raise AttackInputError("the inversion attack needs the model's architecture")
    batch_size, method = estimate_batch_size(view, config.seed)
    bounds = None
    if view.bounds is not None:
        low, high = (torch.tensor(b, dtype=torch.float64).reshape(-1, 1, 1) for b in view.bounds)
        bounds = (low, high)
    return invert_gradients(
        view.architecture,
        view.weights,
        [view.gradient],
        input_shape=view.input_shape,
        batch_size=batch_size,
        labels=[view.labels] if view.labels is not None else None,
        bounds=bounds,
        batch_size_method=method,
        config=config,
    )[0]


ATTACKS: Registry[RegisteredAttack] = Registry("attack", key="audit.attacks")
for _attack in (
    RegisteredAttack("spearpp", SpearConfig, whole_model=False, run=_spearpp),
    RegisteredAttack("inversion", InversionConfig, whole_model=True, run=_inversion),
    RegisteredAttack("analytic", AnalyticConfig, whole_model=False, run=_analytic),
):
    ATTACKS.add(_attack.name, _attack)


def run_attack(name: str, view: ServerView, config: Any) -> Reconstruction:
    """Run the attack registered as ``name`` on ``view``.

    Raises
    ------
    AttackInputError
        For an unknown name, a config of the wrong type, or inputs the attack refuses.
    """
    if name not in ATTACKS:
        raise AttackInputError(f"attack {name!r}: allowed are {', '.join(sorted(ATTACKS))}")
    attack = ATTACKS[name]
    if not isinstance(config, attack.config_type):
        raise AttackInputError(
            f"attack {name!r} takes a {attack.config_type.__name__}, got {type(config).__name__}"
        )
    return attack.run(view, config)
