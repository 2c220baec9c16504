"""``dp``: DP-SGD through Opacus (per-sample clipping to C, Gaussian noise sigma * C on each
step's sum, averaged over the mini-batch), with FedAvg's epochs and mini-batches; epsilon
accumulated across rounds by the client's :class:`~clients.privacy.PrivacyLedger`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from flwr.app import ConfigRecord, ConfigRecordValues, RecordDict
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from pydantic import Field, field_validator
from torch import nn

from clients import training
from clients.defences.base import EPSILON, STEPS, Delta, Disclosure, register
from clients.defences.fedavg import EpochSettings, FedAvg
from clients.privacy import PrivacyLedger
from clients.training import TrainResult
from flsim_plugins.settings import Bool, Real

# What a DP-SGD client declares after its round.
CLIP = "clip"
NOISE_MULTIPLIER = "noise-multiplier"
NOISE_STD = "noise-std"
POISSON = "poisson"
DELTA = "delta"
# The client's ledger in its persistent state.
LEDGER = "privacy-ledger"


class DpSettings(EpochSettings):
    """DP-SGD.

    Parameters
    ----------
    lr, epochs, mini_batch
        As FedAvg's.
    clip
        Per-sample clip norm C.
    noise_multiplier
        Noise multiplier sigma (noise std sigma * C on the summed gradient).
    poisson
        Poisson sampling: each step takes every sample with probability mini_batch / B (random
        batch sizes, empty batches skipped), as the RDP accountant assumes; otherwise shuffled
        fixed-size mini-batches.
    delta
        The delta of the (epsilon, delta) the ledger reports.
    """

    defence: ClassVar[str] = "dp"
    clip: Real = 1.0
    noise_multiplier: Annotated[Real, Field(ge=0)] = 0.0
    poisson: Bool = False
    delta: Delta = 1e-5

    @field_validator("clip")
    @classmethod
    def _positive_clip(cls, clip: float) -> float:
        if not clip > 0:
            raise ValueError("need clip > 0 (a per-sample norm bound)")
        return clip


@register
class DpSgd(FedAvg):
    """DP-SGD: every step's gradient clipped per sample and noised (Opacus)."""

    Settings = DpSettings
    order = 2

    def train(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        settings: Any,
        generator: torch.Generator,
    ) -> TrainResult:
        """DP-SGD; per-sample gradients are held for as many samples at once as fit
        :data:`clients.training.PER_SAMPLE_BUDGET`."""
        size = settings.size(len(x))
        steps = training.batches(len(x), size, settings.epochs, generator, settings.poisson)
        physical = training.physical_batch(model, training.PER_SAMPLE_BUDGET)
        private = GradSampleModule(model)
        opt = DPOptimizer(
            torch.optim.SGD(private.parameters(), lr=settings.lr),
            noise_multiplier=settings.noise_multiplier,
            max_grad_norm=settings.clip,
            expected_batch_size=size,
            generator=generator,
        )
        loss, first = training.sgd_steps(private, opt, x, y, steps, physical)
        private._close()
        return TrainResult(
            steps=len(steps),
            loss=loss,
            noise_std=settings.noise_multiplier * settings.clip / size,
            sample_rate=size / len(x),
            first_loss=first,
        )

    def spend(
        self, settings: Any, result: TrainResult, state: RecordDict
    ) -> dict[str, ConfigRecordValues]:
        """The round's steps on the ledger kept in ``state``; the noise and epsilon so far."""
        ledger = PrivacyLedger()
        if LEDGER in state:
            kept = state[LEDGER]
            if not isinstance(kept, ConfigRecord):
                raise ValueError(f"the client's state {LEDGER!r} is not a ConfigRecord")
            ledger = PrivacyLedger.from_lists(kept["noise"], kept["rate"], kept["steps"])  # type: ignore[arg-type]
        ledger = ledger.spend(settings.noise_multiplier, result.sample_rate, result.steps)
        state[LEDGER] = ConfigRecord(ledger.as_lists())  # type: ignore[arg-type]
        return {
            CLIP: settings.clip,
            NOISE_MULTIPLIER: settings.noise_multiplier,
            NOISE_STD: result.noise_std,
            POISSON: settings.poisson,
            DELTA: settings.delta,
            EPSILON: ledger.epsilon(settings.delta),
        }

    def disclose(self, declared: Mapping[str, Any], weight_update: np.ndarray | None) -> Disclosure:
        """The declared per-step noise, sqrt(steps) times over (each step adds its own);
        one step: the next layer's gradient fixes the samples' scales."""
        steps = int(declared.get(STEPS, 0))
        std = declared.get(NOISE_STD)
        return Disclosure(
            adds_noise=True,
            noise_std=float(std) * math.sqrt(steps or 1) if std is not None else None,
            next_layer=steps == 1,
        )
