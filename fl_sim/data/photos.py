"""Offline default dataset: 32x32 crops of the photographs that ship inside scikit-image,
labelled by source photo (10 classes), so a run works with no internet and no CIFAR-10."""

from __future__ import annotations

import numpy as np
import skimage.data
from skimage.color import gray2rgb
from skimage.transform import resize

from fl_sim.data.cifar10 import ImageSet

# Real photographs bundled with scikit-image (no download), one class each.
PHOTOS = (
    "astronaut", "chelsea", "coffee", "rocket", "coins",
    "immunohistochemistry", "gravel", "stereo_motorcycle", "camera", "grass",
)  # fmt: skip
# Each photo is scaled so its short side has this many pixels before cropping, so a 32x32 crop
# shows a recognisable part of it rather than a flat patch.
_SHORT_SIDE = 128
# A crop must vary this much (pixel std on [0, 1]) and differ this much from every crop taken
# before from the same photo (mean absolute pixel difference).
_MIN_STD = 0.05
_MIN_DIFF = 0.08


def _photo(name: str) -> np.ndarray:
    image = getattr(skimage.data, name)()
    if isinstance(image, tuple):  # stereo pairs: the left view
        image = image[0]
    image = np.asarray(image)
    if image.ndim == 2:
        image = gray2rgb(image)
    scale = _SHORT_SIDE / min(image.shape[:2])
    shape = (round(image.shape[0] * scale), round(image.shape[1] * scale))
    small = resize(image[..., :3], shape, anti_aliasing=True, preserve_range=True)
    out: np.ndarray = np.clip(np.rint(small), 0, 255).astype(np.uint8)
    return out


def _crops(name: str, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` random 32x32 crops (random horizontal flips), skipping flat patches and
    near-copies of crops already taken: identical inputs are indistinguishable to any attack,
    and a dataset full of them would measure that rather than leakage."""
    photo = _photo(name)
    h, w, _ = photo.shape
    taken: list[np.ndarray] = []
    for _ in range(200 * count):
        if len(taken) == count:
            break
        top, left = rng.integers(0, h - 31), rng.integers(0, w - 31)
        crop = photo[top : top + 32, left : left + 32]
        crop = crop[:, ::-1] if rng.random() < 0.5 else crop
        pixels = crop.astype(np.float64) / 255
        if pixels.std() < _MIN_STD:
            continue
        if any(np.abs(pixels - t.astype(np.float64) / 255).mean() < _MIN_DIFF for t in taken):
            continue
        taken.append(np.ascontiguousarray(crop))
    if len(taken) < count:
        raise ValueError(
            f"the offline photo {name!r} yields {len(taken)} distinct 32x32 crops, {count} were "
            "asked for: use CIFAR-10 (data.source = 'cifar10') for runs this large"
        )
    return taken


def load_photos(per_class: int, seed: int) -> ImageSet:
    """``per_class`` distinct random 32x32 crops of each photo, labelled by photo."""
    rng = np.random.default_rng(seed)
    images: list[np.ndarray] = []
    labels: list[int] = []
    for label, name in enumerate(PHOTOS):
        images += _crops(name, per_class, rng)
        labels += [label] * per_class
    order = rng.permutation(len(labels))
    return ImageSet(
        np.ascontiguousarray(np.stack(images)[order]),
        np.asarray(labels, dtype=np.int64)[order],
        "photos:scikit-image",
    )
