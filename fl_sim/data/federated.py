"""The simulated world's data: which dataset, each client's partition, the held-out test split."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from fl_sim.data.breast_cancer import load_breast_cancer_records
from fl_sim.data.cifar10 import CLASSES, load_cifar10
from fl_sim.data.description import DataDescription
from fl_sim.data.imagefolder import load_image_folder
from fl_sim.data.normalize import Normalization, fitted_normalization, to_unit
from fl_sim.data.partition import (
    partition_dirichlet,
    partition_iid,
    split_held_out,
    split_holdout,
)
from fl_sim.data.photos import PHOTOS, load_photos
from fl_sim.data.records import RecordSet
from fl_sim.data.spec import DataSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FederatedData:
    """Records of the run, split into client partitions and a test set.

    Attributes
    ----------
    records, labels
        The whole pool: raw records in the model's layout (uint8 N x 3 x 32 x 32 images,
        float64 N x 30 breast-cancer records, ...), int64 labels.
    source
        What was actually used (recorded in every run).
    partitions
        Per client, indices into the pool.
    test
        Indices of the held-out test split.
    description
        The inputs' shape, number of classes, value range and normalisation.
    """

    records: np.ndarray
    labels: np.ndarray
    source: str
    partitions: tuple[np.ndarray, ...]
    test: np.ndarray
    description: DataDescription

    def tensors(self, index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised float32 inputs (k x sample shape) and labels at ``index``."""
        return self.description.inputs(self.records[index]), torch.from_numpy(self.labels[index])

    def unit(self, index: np.ndarray) -> torch.Tensor:
        """The records at ``index`` on the [0, 1] scale, in float64: the judge's ground truth."""
        return self.description.unit(self.records[index])


def _pool(spec: DataSpec, needed: int, seed: int) -> RecordSet:
    if spec.mirror:
        return _source(spec, math.ceil(needed / 2), seed).with_mirrors()
    return _source(spec, needed, seed)


def _source(spec: DataSpec, needed: int, seed: int) -> RecordSet:
    if spec.source == "breast_cancer":
        return load_breast_cancer_records()
    if spec.source == "imagefolder":
        assert spec.root is not None  # DataSpec requires it
        return load_image_folder(Path(spec.root).expanduser(), spec.image_size)
    if spec.source in ("auto", "cifar10"):
        where = Path(spec.cifar10_dir).expanduser()
        try:
            return RecordSet.from_images(
                load_cifar10(where, "train", download=spec.download), len(CLASSES)
            )
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
    return RecordSet.from_images(load_photos(math.ceil(needed / len(PHOTOS)), seed), len(PHOTOS))


def _normalization(pool: RecordSet, train: np.ndarray) -> Normalization:
    """Mean and std per channel or feature of the training split on the [0, 1] scale."""
    return fitted_normalization(to_unit(pool.records[train], pool.low, pool.high, torch.float64))


@lru_cache(maxsize=4)
def federated_data(spec: DataSpec, clients: int, seed: int) -> FederatedData:
    """Load and split the data of a run (cached per process: every client calls it)."""
    needed = clients * spec.samples_per_client + spec.test_size
    pool = _pool(spec, needed, seed)
    if pool.held_out is not None:
        train, test = split_held_out(len(pool.labels), pool.held_out, spec.test_size, seed)
    else:
        train, test = split_holdout(len(pool.labels), spec.test_size, seed)
    if spec.partition == "iid":
        local = partition_iid(len(train), clients, spec.samples_per_client, seed)
    else:
        local = partition_dirichlet(
            pool.labels[train], clients, spec.samples_per_client, spec.alpha, seed
        )
    description = DataDescription(
        input_shape=tuple(pool.records.shape[1:]),
        num_classes=pool.num_classes,
        low=pool.low,
        high=pool.high,
        normalization=_normalization(pool, train),
        feature_names=pool.feature_names,
    )
    return FederatedData(
        records=pool.records,
        labels=pool.labels,
        source=pool.source,
        partitions=tuple(train[p] for p in local),
        test=test,
        description=description,
    )
