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
    "astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
    "immunohistochemistry", "retina", "stereo_motorcycle", "camera", "grass",
)  # fmt: skip
# Each photo is scaled so its short side has this many pixels before cropping, so a 32x32 crop
# shows a recognisable part of it rather than a flat patch.
_SHORT_SIDE = 96


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


def load_photos(per_class: int, seed: int) -> ImageSet:
    """``per_class`` random 32x32 crops (with random horizontal flips) of each photo."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label, name in enumerate(PHOTOS):
        photo = _photo(name)
        h, w, _ = photo.shape
        for _ in range(per_class):
            top, left = rng.integers(0, h - 31), rng.integers(0, w - 31)
            crop = photo[top : top + 32, left : left + 32]
            images.append(crop[:, ::-1] if rng.random() < 0.5 else crop)
            labels.append(label)
    order = rng.permutation(len(labels))
    return ImageSet(
        np.ascontiguousarray(np.stack(images)[order]),
        np.asarray(labels, dtype=np.int64)[order],
        "photos:scikit-image",
    )
