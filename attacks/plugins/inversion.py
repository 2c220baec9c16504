"""The optimisation attack in the audit: gradient matching on the whole model, once per
gradient distance, ``[audit.inversion]``."""

from __future__ import annotations

import torch
from pydantic import field_validator

from attacks.errors import AttackInputError
from attacks.inversion import LOSSES, InversionConfig, InversionSettings, invert_gradients
from attacks.plugin import AttackPlugin, AttackTable, register
from attacks.result import Reconstruction
from attacks.view import ServerView, estimate_batch_size
from flsim_plugins.settings import Names, Settings, distinct


class InversionTable(AttackTable, InversionSettings):
    """``[audit.inversion]``: where and how the optimisation-based attack runs.

    Parameters
    ----------
    rounds, clients
        Its targets within the audit's (empty: all).
    losses
        Gradient distances, one attack per loss: ``cosine`` and/or ``l2``.
    restarts, iterations, lr, tv, signed, dtype, device
        How it optimises: :class:`attacks.inversion.InversionSettings`, declared there.
    """

    model_config = Settings.model_config
    losses: Names = ("cosine",)

    @field_validator("losses")
    @classmethod
    def _losses(cls, losses: tuple[str, ...]) -> tuple[str, ...]:
        return distinct(losses, LOSSES)


@register
class Inversion(AttackPlugin):
    """Inverting Gradients' family: the batch that best matches the whole update."""

    name = "inversion"
    Config = InversionConfig
    Table = InversionTable
    whole_model = True

    def variants(self, table: InversionTable) -> tuple[str, ...]:
        return table.losses

    def config(self, table: InversionTable, variant: str | None, seed: int) -> InversionConfig:
        shared = table.model_dump(include=set(InversionSettings.model_fields))
        return InversionConfig.model_validate({**shared, "loss": variant, "seed": seed})

    def run(self, view: ServerView, config: InversionConfig) -> Reconstruction:
        if view.architecture is None:
            raise AttackInputError("the inversion attack needs the model's architecture")
        batch_size, method = estimate_batch_size(view, config.seed)
        bounds = None
        if view.bounds is not None:
            low, high = (
                torch.tensor(b, dtype=torch.float64).reshape(-1, 1, 1) for b in view.bounds
            )
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
