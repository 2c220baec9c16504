"""The CIFAR-10 reader on a directory written in torchvision's python-batch format."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from fl_sim.data.cifar10 import BATCH_DIR, TEST_FILES, TRAIN_FILES, load_cifar10


def _write(root: Path, per_batch: int = 4) -> dict[str, np.ndarray]:
    folder = root / BATCH_DIR
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name in TRAIN_FILES + TEST_FILES:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        with (folder / name).open("wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)
        written[name] = data
    return written


def test_reads_train_and_test(tmp_path: Path) -> None:
    written = _write(tmp_path)
    train = load_cifar10(tmp_path, "train")
    test = load_cifar10(tmp_path, "test")
    assert train.images.shape == (20, 32, 32, 3) and test.images.shape == (4, 32, 32, 3)
    # Rows are channel-major (1024 R, 1024 G, 1024 B): pixel (0, 0) of image 0.
    first = written["data_batch_1"][0]
    assert tuple(train.images[0, 0, 0]) == (first[0], first[1024], first[2048])
    assert train.labels.dtype == np.int64 and "cifar10:" in train.source


def test_missing_batch_is_named(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / BATCH_DIR / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_cifar10(tmp_path, "train")


def test_npz(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    np.savez(path, images=np.zeros((3, 32, 32, 3), np.uint8), labels=np.arange(3))
    data = load_cifar10(path)
    assert data.images.shape == (3, 32, 32, 3) and list(data.labels) == [0, 1, 2]
