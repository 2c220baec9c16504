"""What every reader and writer of a run's inputs needs to know about them: their shape, the
number of classes, the value range of the judge's [0, 1] scale and the normalisation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fl_sim.data.normalize import Normalization, to_unit


@dataclass(frozen=True)
class DataDescription:
    """The shape and scales of a run's inputs; it travels with the data.

    Raw records go to [0, 1] through the value range, ``(raw - low) / (high - low)`` per
    channel or feature (pixels / 255 for images, min-max for tabular records), then to the
    model's inputs through the normalisation. The judge compares samples on the [0, 1] scale.

    Attributes
    ----------
    input_shape
        One sample as the model takes it, before flattening: (3, 32, 32) or (30,).
    num_classes
        Size of the classifier's head.
    low, high
        Per entry of a sample's first axis, the raw values mapped to 0 and 1.
    normalization
        Statistics of the training split on the [0, 1] scale, applied to every input.
    feature_names
        One per feature of a tabular record (empty for images).
    """

    input_shape: tuple[int, ...]
    num_classes: int
    low: tuple[float, ...]
    high: tuple[float, ...]
    normalization: Normalization
    feature_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.normalization.ndim != len(self.input_shape):
            raise ValueError(
                f"a normalisation of {self.normalization.ndim}-D samples for samples of shape "
                f"{self.input_shape}"
            )

    @property
    def input_dim(self) -> int:
        """Inputs of the first linear layer: the flattened sample."""
        return math.prod(self.input_shape)

    @property
    def is_image(self) -> bool:
        """Whether a sample is an image, C x H x W (else a vector of features)."""
        return len(self.input_shape) == 3

    def unit(self, records: np.ndarray, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Raw records (k x sample shape) on the [0, 1] scale, as ``dtype``."""
        return to_unit(records, self.low, self.high, dtype)

    def inputs(self, records: np.ndarray) -> torch.Tensor:
        """Raw records (k x sample shape) as the model's normalised float32 inputs."""
        return self.normalization.apply(self.unit(records, torch.float32))
