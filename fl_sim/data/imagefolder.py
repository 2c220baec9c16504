"""Users' own images in torchvision's ImageFolder layout: ``root/train/<class>/*`` and
``root/test/<class>/*``, read by torchvision's ``ImageFolder`` and decoded once into a cache.

The clients train on the train split; the server's test set (and a dishonest server's public
data) comes from the test split, as with any dataset that ships both.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
from torchvision.datasets import ImageFolder
from torchvision.transforms import CenterCrop, Compose, Resize

from fl_sim.data.records import RecordSet

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
# Where decoded folders are kept (a 60,000-image folder decodes in about a minute; every
# simulated client reads the data, so each would pay it again).
CACHE_DIR = Path("~/.cache/fl-sim/imagefolder")


def _listing(root: Path) -> dict[str, ImageFolder]:
    """The two splits as torchvision reads them; errors name what is missing."""
    if not root.is_dir():
        raise FileNotFoundError(f"data.root = {str(root)!r} is not a folder")
    found = {}
    for split in SPLITS:
        folder = root / split
        if not folder.is_dir():
            raise FileNotFoundError(
                f"data.root = {str(root)!r} has no {split}/ folder: the layout is "
                "root/train/<class>/* and root/test/<class>/* (torchvision's ImageFolder)"
            )
        try:
            found[split] = ImageFolder(str(folder))
        except (FileNotFoundError, RuntimeError) as err:  # no class folders, or no images
            raise FileNotFoundError(f"{folder}: {err}") from err
    train, test = found["train"].classes, found["test"].classes
    if train != test:
        raise ValueError(
            f"data.root = {str(root)!r}: train/ has classes {train} and test/ has {test}; "
            "both splits need the same class folders"
        )
    return found


def _key(found: dict[str, ImageFolder], image_size: int | None) -> str:
    """A name for the decoded folder: its files, their sizes and times, and the image size."""
    digest = hashlib.sha256(repr(image_size).encode())
    for split in SPLITS:
        for path, label in found[split].samples:
            stat = os.stat(path)
            digest.update(
                f"{split}\0{path}\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()
            )
    return digest.hexdigest()[:24]


def _decode(folder: ImageFolder, image_size: int | None) -> np.ndarray:
    """N x 3 x H x W uint8 pixels; every image must share one size unless ``image_size``
    resizes them (short side, then a centre crop)."""
    resize = Compose([Resize(image_size), CenterCrop(image_size)]) if image_size else None
    pixels: list[np.ndarray] = []
    for path, _ in folder.samples:
        image = folder.loader(path).convert("RGB")
        if resize is not None:
            image = resize(image)
        array = np.asarray(image, dtype=np.uint8)
        if pixels and array.shape != pixels[0].shape:
            raise ValueError(
                f"{path} is {array.shape[1]}x{array.shape[0]} pixels where "
                f"{folder.samples[0][0]} is {pixels[0].shape[1]}x{pixels[0].shape[0]}: set "
                "data.image_size to resize every image to one size"
            )
        pixels.append(array)
    return np.ascontiguousarray(np.stack(pixels).transpose(0, 3, 1, 2))


def load_image_folder(root: Path, image_size: int | None = None) -> RecordSet:
    """Both splits of ``root`` as one record set, train first; ``held_out`` marks the test
    split's records."""
    found = _listing(root)
    cache = CACHE_DIR.expanduser() / f"{_key(found, image_size)}.npz"
    if cache.is_file():
        with np.load(cache) as stored:
            records, labels, test = stored["records"], stored["labels"], stored["test"]
    else:
        log.info("decoding the images of %s once into %s", root, cache)
        parts = [_decode(found[split], image_size) for split in SPLITS]
        records = np.concatenate(parts)
        labels = np.concatenate(
            [np.asarray(found[split].targets, dtype=np.int64) for split in SPLITS]
        )
        test = np.arange(len(parts[0]), len(records))
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(".partial.npz")
        np.savez(partial, records=records, labels=labels, test=test)
        partial.replace(cache)  # whole or absent: a crash leaves no half-written cache
    source = f"imagefolder:{root}"
    return RecordSet.from_pixels(records, labels, source, len(found["train"].classes), test)
