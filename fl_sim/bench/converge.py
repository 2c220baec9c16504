"""Networks trained on a whole training split before they are attacked: a federation's late
rounds, where the global model has learnt the task.

Training is the costly part (minutes per network on two cores), so each trained network is kept
in a cache named by everything that determines it: the settings, the architecture, the seed,
the normalisation and the training images themselves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization
from fl_sim.model import fc_relu_net

log = logging.getLogger(__name__)

CACHE_DIR = Path("~/.cache/fl-sim/converged")
# The test-accuracy a network must reach to stand for a converged one (what the issue of
# trained networks asks for); below it a row says so rather than failing.
TARGET_ACCURACY = 0.45
# Images per forward pass when scoring accuracy: bounds memory at m = 4000.
_EVAL_CHUNK = 2000


@dataclass(frozen=True)
class TrainedNetwork:
    """A trained network's weights (float32 state dict) and how well it classifies."""

    state: dict[str, torch.Tensor]
    test_accuracy: float
    train_accuracy: float
    seconds: float


@dataclass(frozen=True)
class Convergence:
    """SGD with momentum over whole epochs of a training split, in float32 (the attacked client
    then computes its update in the bench's dtype from these weights).

    Parameters
    ----------
    epochs
        Passes over the training split.
    lr, momentum
        SGD's learning rate and momentum.
    batch_size
        Images per step, each epoch a fresh permutation of the split.
    """

    epochs: int = 8
    lr: float = 0.01
    momentum: float = 0.9
    batch_size: int = 128

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"convergence epochs={self.epochs}: must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"convergence lr={self.lr}: must be > 0")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"convergence momentum={self.momentum}: must be in [0, 1)")
        if self.batch_size < 1:
            raise ValueError(f"convergence batch_size={self.batch_size}: must be >= 1")

    @property
    def label(self) -> str:
        """Suffix for a case's name."""
        return f" [converged {self.epochs} epochs]"

    def network(
        self,
        width: int,
        depth: int,
        seed: int,
        train: ImageSet,
        test: ImageSet,
        norm: Normalization,
    ) -> TrainedNetwork:
        """``fc_relu_net(width, depth)`` initialised from ``seed`` and trained on all of
        ``train`` (normalised by ``norm``), scored on ``test``; read from :data:`CACHE_DIR`
        when this exact network was trained before."""
        where = CACHE_DIR.expanduser() / f"{self._key(width, depth, seed, train, norm)}.pt"
        if where.is_file():
            return TrainedNetwork(**torch.load(where, weights_only=True))
        start = time.perf_counter()
        inputs, labels = _normalised(train, norm)
        torch.manual_seed(seed)
        model = fc_relu_net(width, depth)
        name = f"m={width} depth {depth} seed {seed}"
        self._train(model, inputs, labels, torch.Generator().manual_seed(seed), name)
        trained = TrainedNetwork(
            {k: v.detach().clone() for k, v in model.state_dict().items()},
            _accuracy(model, *_normalised(test, norm)),
            _accuracy(model, inputs, labels),
            time.perf_counter() - start,
        )
        log.info(
            "converged %s: test accuracy %.3f, train %.3f",
            name,
            trained.test_accuracy,
            trained.train_accuracy,
        )
        where.parent.mkdir(parents=True, exist_ok=True)
        partial = where.with_suffix(f".{os.getpid()}.tmp")
        torch.save(asdict(trained), partial)
        partial.replace(where)  # a stopped run leaves no half-written network behind
        return trained

    def _key(self, width: int, depth: int, seed: int, train: ImageSet, norm: Normalization) -> str:
        settings = {"convergence": asdict(self), "width": width, "depth": depth, "seed": seed}
        digest = hashlib.sha256(json.dumps({**settings, "norm": asdict(norm)}).encode())
        digest.update(train.images.tobytes())
        digest.update(train.labels.tobytes())
        return digest.hexdigest()[:24]

    def _train(
        self,
        model: nn.Module,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        order: torch.Generator,
        name: str,
    ) -> None:
        """Train ``model`` in place, each epoch over ``inputs`` in an order drawn from
        ``order``."""
        start = time.perf_counter()
        opt = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum)
        for epoch in range(self.epochs):
            model.train()
            for idx in torch.randperm(len(labels), generator=order).split(self.batch_size):
                opt.zero_grad()
                nn.functional.cross_entropy(model(inputs[idx]), labels[idx]).backward()
                opt.step()
            log.info(
                "converging %s: epoch %d of %d, %.0f s",
                name,
                epoch + 1,
                self.epochs,
                time.perf_counter() - start,
            )
        opt.zero_grad()


def _normalised(images: ImageSet, norm: Normalization) -> tuple[torch.Tensor, torch.Tensor]:
    pixels = torch.from_numpy(images.images).permute(0, 3, 1, 2).to(torch.float32) / 255
    return norm.apply(pixels), torch.from_numpy(images.labels).long()


def _accuracy(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        right = sum(
            int((model(x).argmax(1) == y).sum())
            for x, y in zip(inputs.split(_EVAL_CHUNK), labels.split(_EVAL_CHUNK), strict=True)
        )
    return right / len(labels)
