"""The ``[data]`` table: where a scenario's records come from and how they are split."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from flsim_plugins.settings import AtLeastOne, Bool, Positive, Settings, Str


class DataSpec(Settings):
    """Where the records come from and how they are split.

    Parameters
    ----------
    source
        ``auto`` (CIFAR-10 if found, else the offline photographs), ``cifar10``, ``photos``
        (images), ``imagefolder`` (a folder of one's own images, see ``root``) or
        ``breast_cancer`` (scikit-learn's tabular medical records, 30 features).
    root
        With ``source = "imagefolder"``: a folder in torchvision's ImageFolder layout,
        ``root/train/<class>/*`` (the clients' images) and ``root/test/<class>/*`` (the server's
        test set is drawn from these). Decoded once into ``~/.cache/fl-sim/imagefolder``.
    image_size
        With ``source = "imagefolder"``: resize every image (short side, then a centre crop) to
        this many pixels square; unset, every image must already share one size.
    cifar10_dir
        Folder holding ``cifar-10-batches-py`` (or an .npz of images and labels).
    download
        Fetch CIFAR-10 into ``cifar10_dir`` when missing (needs the internet).
    partition
        ``iid`` or ``dirichlet`` (label skew).
    alpha
        Dirichlet concentration; small is more skewed.
    samples_per_client
        Local set size of each client.
    test_size
        Held-out samples for the global model's test loss and accuracy.
    mirror
        Add every image's horizontal mirror image to the pool (the usual CIFAR-10 augmentation),
        doubling a small local copy such as a 1,000-image .npz; ``cifar10`` only (the offline
        photographs' crops are already flipped at random, so their mirrors could be near-copies
        of other crops).
    """

    source: Literal["auto", "cifar10", "photos", "imagefolder", "breast_cancer"] = "auto"
    cifar10_dir: Str = "~/.cache/fl-sim/cifar10"
    root: Str | None = None
    image_size: AtLeastOne | None = None
    download: Bool = False
    partition: Literal["iid", "dirichlet"] = "iid"
    alpha: Positive = 0.5
    samples_per_client: AtLeastOne = 64
    test_size: AtLeastOne = 500
    mirror: Bool = False

    @model_validator(mode="after")
    def _mirror_cifar10_only(self) -> DataSpec:
        """Only CIFAR-10's images are mirrored (see ``mirror``)."""
        if self.mirror and self.source != "cifar10":
            raise ValueError(
                f"data.mirror = true with data.source = {self.source!r}: only 'cifar10' is mirrored"
            )
        return self

    @model_validator(mode="after")
    def _root_with_imagefolder(self) -> DataSpec:
        """An image folder needs its root; the root and image size mean nothing elsewhere."""
        folder = self.source == "imagefolder"
        if folder and self.root is None:
            raise ValueError(
                "data.source = 'imagefolder' needs data.root, a folder holding train/<class>/* "
                "and test/<class>/*"
            )
        for name in ("root", "image_size"):
            if not folder and getattr(self, name) is not None:
                raise ValueError(
                    f"data.{name} is read only with data.source = 'imagefolder' "
                    f"(data.source = {self.source!r})"
                )
        return self
