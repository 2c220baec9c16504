"""The simulated world's data: which dataset, each client's partition, the held-out test split."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from fl_sim.config.schema import DataSpec
from fl_sim.data.cifar10 import ImageSet, load_cifar10
from fl_sim.data.normalize import Normalization
from fl_sim.data.partition import partition_dirichlet, partition_iid, split_holdout
from fl_sim.data.photos import PHOTOS, load_photos

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FederatedData:
    """Images of the run, split into client partitions and a test set.

    Attributes
    ----------
    images, labels
        The whole pool (uint8 N x 32 x 32 x 3, int64 N).
    source
        What was actually used (recorded in every run).
    partitions
        Per client, indices into the pool.
    test
        Indices of the held-out test split.
    normalization
        Per-channel statistics of the training split, applied to every input.
    """

    images: np.ndarray
    labels: np.ndarray
    source: str
    partitions: tuple[np.ndarray, ...]
    test: np.ndarray
    normalization: Normalization

    def tensors(self, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised float32 images (k x 3 x 32 x 32) and labels at ``index``."""
        pixels = torch.from_numpy(self.images[index]).permute(0, 3, 1, 2).float() / 255
        return self.normalization.apply(pixels), torch.from_numpy(self.labels[index])


def _pool(spec: DataSpec, needed: int, seed: int) -> ImageSet:
    if spec.source in ("auto", "cifar10"):
        where = Path(spec.cifar10_dir).expanduser()
        try:
            return load_cifar10(where, "train", download=spec.download)
        except (FileNotFoundError, OSError) as err:
            if spec.source == "cifar10":
                raise FileNotFoundError(
                    f"CIFAR-10 not found at {where} ({err}); set data.download = true on a "
                    "machine with internet, or data.source = 'photos'"
                ) from err
            log.warning(
                "CIFAR-10 not found at %s: using the offline photographs (%d classes of 32x32 "
                "crops from scikit-image's sample photos) instead",
                where,
                len(PHOTOS),
            )
    return load_photos(math.ceil(needed / len(PHOTOS)), seed)


@lru_cache(maxsize=4)
def federated_data(spec: DataSpec, clients: int, seed: int) -> FederatedData:
    """Load and split the data of a run (cached per process: every client calls it)."""
    needed = clients * spec.samples_per_client + spec.test_size
    pool = _pool(spec, needed, seed)
    train, test = split_holdout(len(pool.labels), spec.test_size, seed)
    if spec.partition == "iid":
        local = partition_iid(len(train), clients, spec.samples_per_client, seed)
    else:
        local = partition_dirichlet(
            pool.labels[train], clients, spec.samples_per_client, spec.alpha, seed
        )
    pixels = pool.images[train].reshape(-1, 3).astype(np.float64) / 255
    norm = Normalization(tuple(pixels.mean(0).tolist()), tuple(pixels.std(0).tolist()))
    return FederatedData(
        images=pool.images,
        labels=pool.labels,
        source=pool.source,
        partitions=tuple(train[p] for p in local),
        test=test,
        normalization=norm,
    )
