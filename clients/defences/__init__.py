"""The registered defences, one module each, found here by name: a module of this package
that registers a defence (:func:`~clients.defences.base.register`) is all a new defence takes.

:func:`train_locally` trains with a client's training defence.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from clients.defences.base import (
    DEFENCES,
    Defence,
    DefenceSettings,
    Disclosure,
    TrainingDefence,
    TrainingSettings,
    UpdateMod,
    declared_defences,
    defence_label,
    training_defences,
    training_settings,
    update_mods,
)
from clients.training import DivergenceError, TrainResult, divergence

DEFENCES.discover(sys.modules[__name__])


def train_locally(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: TrainingSettings,
    generator: torch.Generator,
    max_loss_growth: float | None = None,
) -> TrainResult:
    """Train ``model`` in place on (x, y) with the training defence ``settings`` belong to.

    ``max_loss_growth`` (e.g. :data:`clients.training.DIVERGENCE_FACTOR`, as a federation's
    clients use it) also counts a loss that blew up as divergence; without it, only non-finite
    values do (an update may be worth studying however bad it is for the model).

    Raises
    ------
    ValueError
        Without samples.
    DivergenceError
        When training diverged (:func:`clients.training.divergence` says why): the model is
        then unusable.
    """
    if len(x) == 0:
        raise ValueError("a client needs at least one sample to train on")
    result = training_defences()[settings.defence].train(model, x, y, settings, generator)
    problem = divergence(model, x, y, result, max_loss_growth)
    if problem is not None:
        raise DivergenceError(
            f"{settings.defence} training at lr={settings.lr:g} diverged: {problem}"
        )
    return result


__all__ = [
    "DEFENCES",
    "Defence",
    "DefenceSettings",
    "Disclosure",
    "TrainingDefence",
    "TrainingSettings",
    "UpdateMod",
    "declared_defences",
    "defence_label",
    "train_locally",
    "training_defences",
    "training_settings",
    "update_mods",
]
