"""``fedavg``: E epochs of SGD over shuffled mini-batches, E x ceil(B / b_mini) steps."""

from __future__ import annotations

from typing import Annotated, ClassVar

import torch
from flwr.app import ConfigRecordValues
from pydantic import Field
from torch import nn

from clients.defences.base import TrainingDefence, TrainingSettings, register
from clients.training import TrainResult, batches, sgd_steps
from flsim_plugins.settings import Int


class EpochSettings(TrainingSettings):
    """Local epochs over mini-batches (FedAvg's, and DP-SGD's).

    Parameters
    ----------
    lr
        Learning rate of local SGD.
    epochs
        Local epochs.
    mini_batch
        Mini-batch size (``None``: the whole batch).
    """

    epochs: Annotated[Int, Field(ge=1)] = 1
    mini_batch: Annotated[Int, Field(ge=1)] | None = None

    def size(self, batch_size: int) -> int:
        """The mini-batch size on a batch of ``batch_size``."""
        return min(self.mini_batch or batch_size, batch_size)


class FedAvgSettings(EpochSettings):
    """FedAvg's local training: ``epochs`` over mini-batches of ``mini_batch``."""

    defence: ClassVar[str] = "fedavg"


@register
class FedAvg(TrainingDefence):
    """FedAvg: the client sends the weights after several local SGD steps."""

    Settings: ClassVar[type[TrainingSettings]] = FedAvgSettings
    order = 1

    def train(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        settings: FedAvgSettings,
        generator: torch.Generator,
    ) -> TrainResult:
        """E epochs of SGD over shuffled mini-batches."""
        size = settings.size(len(x))
        steps = batches(len(x), size, settings.epochs, generator)
        opt = torch.optim.SGD(model.parameters(), lr=settings.lr)
        loss, first = sgd_steps(model, opt, x, y, steps)
        return TrainResult(
            len(steps), loss, noise_std=0.0, sample_rate=size / len(x), first_loss=first
        )

    def declare(self, settings: EpochSettings, batch_size: int) -> dict[str, ConfigRecordValues]:
        """Epochs and the mini-batch size."""
        return {"epochs": settings.epochs, "mini-batch": settings.mini_batch or batch_size}
