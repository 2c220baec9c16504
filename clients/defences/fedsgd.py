"""``fedsgd``: one SGD step on the whole batch; the update is -lr times the batch gradient."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ConfigRecordValues
from pydantic import model_validator
from torch import nn

from clients.defences.base import Disclosure, TrainingDefence, TrainingSettings, register
from clients.training import TrainResult, sgd_steps


class FedSgdSettings(TrainingSettings):
    """One full-batch step at learning rate ``lr``."""

    defence: ClassVar[str] = "fedsgd"

    @model_validator(mode="before")
    @classmethod
    def _one_step(cls, data: Any) -> Any:
        # Named, not "unknown key": a caller asking FedSGD for epochs misunderstands it.
        if isinstance(data, dict) and {"epochs", "mini_batch"} & set(data):
            raise ValueError("defence='fedsgd' takes one full-batch step: no epochs or mini_batch")
        return data


@register
class FedSgd(TrainingDefence):
    """FedSGD: the client sends the weights after one step on its whole batch."""

    Settings = FedSgdSettings
    order = 0

    def train(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        settings: FedSgdSettings,
        generator: torch.Generator,
    ) -> TrainResult:
        """One SGD step on (x, y)."""
        opt = torch.optim.SGD(model.parameters(), lr=settings.lr)
        loss, first = sgd_steps(model, opt, x, y, [torch.arange(len(x))])
        return TrainResult(steps=1, loss=loss, noise_std=0.0, first_loss=first)

    def disclose(self, declared: Mapping[str, Any], weight_update: np.ndarray | None) -> Disclosure:
        """No noise; one step, so the next layer's gradient is of the same batch."""
        return Disclosure(next_layer=True)

    def declare(self, settings: FedSgdSettings, batch_size: int) -> dict[str, ConfigRecordValues]:
        """One epoch of one mini-batch: the whole batch."""
        return {"epochs": 1, "mini-batch": batch_size}
