"""Users' own images: a folder in torchvision's ImageFolder layout, its test split the server's,
decoded once into a cache; clear errors for every layout that cannot be read."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError
from torchvision.datasets import ImageFolder

from fl_sim.bench.invocation import bench_data
from fl_sim.config import parse_scenario
from fl_sim.data import imagefolder
from fl_sim.data.federated import federated_data
from fl_sim.data.spec import DataSpec
from fl_sim.run import run_scenario

SHARED_JPEG = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "cifar10-jpeg.tar.gz"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(imagefolder, "CACHE_DIR", tmp_path / "cache")
    federated_data.cache_clear()


def _folder(root: Path, per_class: dict[str, tuple[int, int]], size: int = 32) -> Path:
    """PNG images (lossless) under root/train/<class> and root/test/<class>: for each class,
    (train count, test count); pixel (0, 0) of image k holds k and the class index."""
    for c, (name, counts) in enumerate(sorted(per_class.items())):
        for split, count in zip(("train", "test"), counts, strict=True):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(count):
                pixels = np.random.default_rng(1000 * c + k).integers(0, 256, (size, size, 3))
                pixels[0, 0] = (k, c, 1 if split == "test" else 0)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{k:04d}.png")
    return root


def test_the_clients_train_on_train_and_the_server_tests_on_test(tmp_path: Path) -> None:
    root = _folder(tmp_path / "images", {"cat": (12, 5), "dog": (10, 4), "eel": (8, 3)})
    spec = DataSpec(source="imagefolder", root=str(root), samples_per_client=6, test_size=9)
    data = federated_data(spec, 4, 0)
    assert data.records.shape == (42, 3, 32, 32) and data.description.num_classes == 3
    from_test = data.records[:, 2, 0, 0] == 1
    assert bool(from_test[data.test].all()) and len(data.test) == 9
    clients = np.concatenate(data.partitions)
    assert not from_test[clients].any() and len(np.unique(clients)) == 24
    # Labels follow the class folders, as torchvision numbers them.
    assert np.array_equal(data.labels, data.records[:, 1, 0, 0].astype(np.int64))
    # The pixels are the files' own (PNG: lossless).
    first = ImageFolder(str(root / "train")).samples[0][0]
    assert np.array_equal(data.records[0].transpose(1, 2, 0), np.asarray(Image.open(first)))


def test_a_folder_is_decoded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _folder(tmp_path / "images", {"a": (4, 2), "b": (4, 2)})
    first = imagefolder.load_image_folder(root)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1

    def no_decoding(*_: object) -> None:
        raise AssertionError("decoded again")

    monkeypatch.setattr(imagefolder, "_decode", no_decoding)
    again = imagefolder.load_image_folder(root)
    assert np.array_equal(first.records, again.records) and again.held_out is not None
    assert np.array_equal(first.labels, again.labels)


def test_images_of_other_sizes_need_an_image_size(tmp_path: Path) -> None:
    root = _folder(tmp_path / "images", {"a": (3, 2), "b": (3, 2)}, size=40)
    Image.new("RGB", (50, 44)).save(root / "train" / "a" / "odd.png")
    with pytest.raises(ValueError, match=re.escape("data.image_size")):
        imagefolder.load_image_folder(root)
    resized = imagefolder.load_image_folder(root, image_size=16)
    assert resized.records.shape == (11, 3, 16, 16)


@pytest.mark.parametrize(
    ("layout", "message"),
    [("no-root", "is not a folder"), ("no-test", "has no test/ folder"),
     ("other-classes", "same class folders"), ("empty-class", "train")],
)  # fmt: skip
def test_unreadable_layouts_are_named(tmp_path: Path, layout: str, message: str) -> None:
    root = tmp_path / "images"
    if layout != "no-root":
        _folder(root, {"a": (2, 1), "b": (2, 1)})
    if layout == "no-test":
        for path in sorted((root / "test").rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (root / "test").rmdir()
    if layout == "other-classes":
        (root / "test" / "b").rename(root / "test" / "c")
    if layout == "empty-class":
        (root / "train" / "z").mkdir()
    with pytest.raises((FileNotFoundError, ValueError), match=message):
        imagefolder.load_image_folder(root)


def test_the_settings_say_what_an_image_folder_needs() -> None:
    with pytest.raises(ValidationError, match=re.escape("needs data.root")):
        DataSpec(source="imagefolder")
    with pytest.raises(ValidationError, match=re.escape("only with data.source = 'imagefolder'")):
        DataSpec(source="photos", root="somewhere")
    with pytest.raises(ValidationError, match=re.escape("only with data.source = 'imagefolder'")):
        DataSpec(source="cifar10", image_size=32)


def test_a_federation_trains_and_is_audited_on_an_image_folder(tmp_path: Path) -> None:
    root = _folder(tmp_path / "images", {"a": (10, 4), "b": (10, 4)})
    raw = {
        "name": "folder",
        "rounds": 1,
        "data": {"source": "imagefolder", "root": str(root), "samples_per_client": 8,
                 "test_size": 6},
        "model": {"width": 64, "depth": 3},
        "clients": {"count": 2, "batch_size": 4, "lr": 0.1},
        "audit": {"knows_batch_size": True},
    }  # fmt: skip
    run_dir = run_scenario(parse_scenario(raw), raw, tmp_path / "run")
    records = (run_dir / "audit.jsonl").read_text().splitlines()
    assert len(records) == 2 and all('"status": "exact"' in r for r in records), records


@pytest.mark.slow  # 60,000 files to extract
@pytest.mark.skipif(not SHARED_JPEG.is_file(), reason="the shared CIFAR-10 JPEGs are not here")
def test_the_shared_cifar10_folder_is_read_as_two_splits(tmp_path: Path) -> None:
    with tarfile.open(SHARED_JPEG) as archive:
        archive.extractall(tmp_path, filter="data")
    root = next(p.parent for p in tmp_path.rglob("train") if (p.parent / "test").is_dir())
    found = imagefolder._listing(root)
    assert len(found["train"]) == 50_000 and len(found["test"]) == 10_000
    assert found["train"].classes[:2] == ["airplane", "automobile"]


def test_the_benches_read_either_split_of_an_image_folder(tmp_path: Path) -> None:
    root = _folder(tmp_path / "images", {"a": (5, 2), "b": (4, 3)})
    train, test = bench_data(str(root), "train"), bench_data(str(root), "test")
    assert train.images.shape == (9, 32, 32, 3) and test.images.shape == (5, 32, 32, 3)
    assert not train.images[:, 0, 0, 2].any() and bool((test.images[:, 0, 0, 2] == 1).all())
    assert np.array_equal(test.labels, test.images[:, 0, 0, 1].astype(np.int64))
    with pytest.raises(SystemExit, match="train/<class>"):
        bench_data(str(tmp_path / "nowhere"), "test")
