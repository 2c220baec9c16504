"""CIFAR-10 from a local copy (torchvision's python-batch layout, or an .npz of images and
labels), or downloaded through torchvision when the machine is online."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BATCH_DIR = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILES = ("test_batch",)
CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


@dataclass(frozen=True)
class ImageSet:
    """Images as uint8 (N, 32, 32, 3), labels as int64 (N,), and where they came from."""

    images: np.ndarray
    labels: np.ndarray
    source: str

    def __post_init__(self) -> None:
        if self.images.ndim != 4 or self.images.shape[1:] != (32, 32, 3):
            raise ValueError(
                f"{self.source}: images must be N x 32 x 32 x 3, got {self.images.shape}"
            )
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"{self.source}: {self.labels.shape[0]} labels for {self.images.shape[0]} images"
            )


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with path.open("rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(data), np.asarray(batch[b"labels"], dtype=np.int64)


def read_python_batches(root: Path, split: str = "train") -> ImageSet:
    """Read ``root/cifar-10-batches-py`` (or ``root`` itself if it is that folder).

    Raises
    ------
    FileNotFoundError
        Naming the first batch file that is missing.
    """
    folder = root if root.name == BATCH_DIR else root / BATCH_DIR
    names = {"train": TRAIN_FILES, "test": TEST_FILES}[split]
    parts = []
    for name in names:
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"CIFAR-10 batch file {path} is missing")
        parts.append(_read_batch(path))
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return ImageSet(images, labels, f"cifar10:{folder}:{split}")


def read_npz(path: Path) -> ImageSet:
    """Read an .npz with ``images`` (N x 32 x 32 x 3 uint8) and ``labels`` (N)."""
    with np.load(path) as f:
        return ImageSet(
            np.asarray(f["images"], np.uint8),
            np.asarray(f["labels"], np.int64),
            f"cifar10-npz:{path}",
        )


def load_cifar10(location: Path, split: str = "train", download: bool = False) -> ImageSet:
    """CIFAR-10 from ``location``: an .npz file, or a folder in torchvision's layout.

    With ``download``, a missing folder is fetched through torchvision (needs the internet).
    """
    if location.suffix == ".npz":
        return read_npz(location)
    if download and not (location / BATCH_DIR).is_dir():
        from torchvision.datasets import CIFAR10

        CIFAR10(str(location), train=split == "train", download=True)
    return read_python_batches(location, split)
