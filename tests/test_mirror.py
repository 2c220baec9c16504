"""``data.mirror``: CIFAR-10's pool doubled by horizontal mirror images, without duplicates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.federated import federated_data
from fl_sim.data.records import RecordSet
from fl_sim.data.spec import DataSpec


def _images(n: int, seed: int) -> ImageSet:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return ImageSet(images, rng.integers(0, 10, n), "test")


@pytest.mark.parametrize("seed", range(3))
def test_mirrors_follow_the_records_with_their_labels(seed: int) -> None:
    pool = RecordSet.from_images(_images(7, seed), 10)
    mirrored = pool.with_mirrors()
    assert len(mirrored.records) == 14 and mirrored.source == "test+mirrored"
    np.testing.assert_array_equal(mirrored.records[:7], pool.records)
    # C x H x W: the mirror reverses the width axis, every channel and row alike.
    np.testing.assert_array_equal(mirrored.records[7:, :, :, ::-1], pool.records)
    np.testing.assert_array_equal(mirrored.labels, np.tile(pool.labels, 2))


def test_symmetric_and_repeated_mirrors_are_left_out() -> None:
    images = _images(4, 0)
    raw = images.images.copy()
    raw[1] = np.maximum(raw[1], raw[1, :, ::-1])  # H x W x C: its own mirror
    raw[3] = raw[2, :, ::-1]  # image 3 is image 2's mirror, so both mirrors are in the pool
    pool = RecordSet.from_images(ImageSet(raw, images.labels, "test"), 10).with_mirrors()
    flat = {r.tobytes() for r in pool.records}
    assert len(flat) == len(pool.records) == 5  # 4 images + the mirror of image 0 only


def test_tabular_records_are_refused() -> None:
    tabular = RecordSet(np.zeros((3, 5)), np.zeros(3, np.int64), "tab", 2, (0.0,) * 5, (1.0,) * 5)
    with pytest.raises(ValueError, match=r"only images .* can be mirrored"):
        tabular.with_mirrors()


def test_federation_draws_from_the_doubled_pool(tmp_path: Path) -> None:
    path = tmp_path / "c.npz"
    images = _images(30, 1)
    np.savez(path, images=images.images, labels=images.labels)
    spec = DataSpec(source="cifar10", cifar10_dir=str(path), samples_per_client=25, test_size=8)
    with pytest.raises(ValueError, match="2 clients x 25 samples = 50 > 22 available"):
        federated_data(spec, 2, 0)
    data = federated_data(spec.model_copy(update={"mirror": True}), 2, 0)
    assert len(data.records) == 60 and data.source.endswith("+mirrored")
    drawn = np.concatenate([*data.partitions, data.test])
    assert len(np.unique(drawn)) == len(drawn) == 58
