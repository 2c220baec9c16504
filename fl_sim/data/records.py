"""A dataset as the federation takes it: raw records in the model's layout, their labels, and
the value range that puts them on the judge's [0, 1] scale."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fl_sim.data.cifar10 import ImageSet

# uint8 pixels span 0..255 in every channel.
_PIXEL_MAX = 255.0


@dataclass(frozen=True)
class RecordSet:
    """Records (N x sample shape), labels (N) and where they came from.

    Attributes
    ----------
    records
        Raw values in the layout the model takes (images C x H x W, tabular records n
        features), any numeric dtype.
    labels
        int64 class ids in ``0..num_classes - 1``.
    source
        What was used (recorded in every run).
    num_classes
        Size of the classifier's head.
    low, high
        Per entry of a sample's first axis (channel or feature), the raw values that map to 0
        and 1 on the [0, 1] scale the normalisation and the judge work on.
    feature_names
        One per feature of a tabular record (empty for images).
    held_out
        Indices of the records that came as the dataset's own test split (an image folder's
        ``test/``), from which the run's test set is drawn; ``None``: the run holds out a
        random share.
    """

    records: np.ndarray
    labels: np.ndarray
    source: str
    num_classes: int
    low: tuple[float, ...]
    high: tuple[float, ...]
    feature_names: tuple[str, ...] = ()
    held_out: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.records)
        if self.records.ndim < 2:
            raise ValueError(
                f"{self.source}: records must be N x sample shape, got {self.records.shape}"
            )
        if self.labels.shape != (n,):
            raise ValueError(f"{self.source}: {self.labels.shape[0]} labels for {n} records")
        if n and not 0 <= self.labels.min() <= self.labels.max() < self.num_classes:
            raise ValueError(f"{self.source}: labels must lie in 0..{self.num_classes - 1}")
        entries = self.records.shape[1]
        if not len(self.low) == len(self.high) == entries:
            raise ValueError(
                f"{self.source}: {len(self.low)} lows and {len(self.high)} highs for {entries} "
                "channels or features"
            )
        if any(h <= lo for lo, h in zip(self.low, self.high, strict=True)):
            raise ValueError(f"{self.source}: every value range needs high > low")
        if self.feature_names and len(self.feature_names) != entries:
            raise ValueError(f"{self.source}: {len(self.feature_names)} names, {entries} features")
        if (
            self.held_out is not None
            and len(self.held_out)
            and not (self.held_out.min() >= 0 and self.held_out.max() < n)
        ):
            raise ValueError(f"{self.source}: held-out indices must lie in 0..{n - 1}")

    @classmethod
    def from_images(cls, images: ImageSet, num_classes: int) -> RecordSet:
        """uint8 images (N x 32 x 32 x 3) as C x H x W records on 0..255 per channel (a view,
        not a copy)."""
        pixels = images.images.transpose(0, 3, 1, 2)
        return cls.from_pixels(pixels, images.labels, images.source, num_classes)

    @classmethod
    def from_pixels(
        cls,
        pixels: np.ndarray,
        labels: np.ndarray,
        source: str,
        num_classes: int,
        held_out: np.ndarray | None = None,
    ) -> RecordSet:
        """uint8 images already N x C x H x W, on 0..255 per channel."""
        channels = pixels.shape[1]
        return cls(
            records=pixels,
            labels=labels,
            source=source,
            num_classes=num_classes,
            low=(0.0,) * channels,
            high=(_PIXEL_MAX,) * channels,
            held_out=held_out,
        )

    def with_mirrors(self) -> RecordSet:
        """The records followed by their horizontal mirror images (images only), leaving out
        every mirror image that is already in the pool: identical inputs are indistinguishable
        to any attack, and a pool full of them would measure that rather than leakage."""
        if self.records.ndim != 4:
            raise ValueError(
                f"{self.source}: only images (N x C x H x W) can be mirrored, the records are "
                f"{self.records.shape}"
            )
        mirrors = np.ascontiguousarray(self.records[..., ::-1])
        # A symmetric image is its own mirror; two mirrors can also coincide.
        seen = {r.tobytes() for r in self.records}
        new = np.zeros(len(mirrors), dtype=bool)
        for i, key in enumerate(m.tobytes() for m in mirrors):
            new[i] = key not in seen
            seen.add(key)
        return replace(
            self,
            records=np.concatenate([self.records, mirrors[new]]),
            labels=np.concatenate([self.labels, self.labels[new]]),
            source=f"{self.source}+mirrored",
        )
