"""Training the network before it is attacked: the audit must hold past initialisation.

The attacked batch is kept out of the pre-training data, so the network has learnt from other
images of the same distribution, as a federation's global model has by a later round.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Pretraining:
    """Plain SGD on cross-entropy before the client's round.

    Parameters
    ----------
    steps
        SGD steps (0: the network stays at initialisation).
    lr
        Learning rate.
    batch_size
        Images per step, drawn with replacement from those outside the attacked batch.
    """

    steps: int = 0
    lr: float = 0.05
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"pretraining steps={self.steps}: must be >= 0")
        if not self.lr > 0:
            raise ValueError(f"pretraining lr={self.lr}: must be > 0")
        if self.batch_size < 1:
            raise ValueError(f"pretraining batch_size={self.batch_size}: must be >= 1")

    @property
    def label(self) -> str:
        """Suffix for a case's name ('' at initialisation)."""
        return f" [trained {self.steps} steps lr {self.lr:g}]" if self.steps else ""

    def apply(
        self,
        model: nn.Module,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        exclude: np.ndarray,
        seed: int,
    ) -> float:
        """Train ``model`` in place on ``inputs`` (normalised) outside the ``exclude`` indices.

        Returns
        -------
        float
            The model's accuracy on the images it could train on, afterwards (nan when
            ``steps`` is 0).
        """
        if not self.steps:
            return float("nan")
        allowed = np.setdiff1d(np.arange(len(labels)), exclude)
        rng = np.random.default_rng(seed + 1_000_003)
        opt = torch.optim.SGD(model.parameters(), lr=self.lr)
        for _ in range(self.steps):
            idx = torch.from_numpy(rng.choice(allowed, self.batch_size))
            opt.zero_grad()
            nn.functional.cross_entropy(model(inputs[idx]), labels[idx]).backward()
            opt.step()
        opt.zero_grad()
        with torch.no_grad():
            seen = torch.from_numpy(allowed)
            return float((model(inputs[seen]).argmax(1) == labels[seen]).double().mean())


def add_pretraining_options(group: argparse._ArgumentGroup, default_steps: int | None) -> None:
    """--pretrain-steps, --pretrain-lr and --pretrain-batch (see :class:`Pretraining`)."""
    group.add_argument(
        "--pretrain-steps",
        type=int,
        default=default_steps,
        help="SGD steps before the client's round (0: none)",
    )
    group.add_argument("--pretrain-lr", type=float, default=0.05)
    group.add_argument("--pretrain-batch", type=int, default=32, help="images per SGD step")
