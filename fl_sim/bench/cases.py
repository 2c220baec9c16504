"""Benchmark cases of the attack, and the presets that group them (the paper's table among them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import torch

from attacks import SpearConfig, paper_config
from clients import TrainingSettings, training_settings
from fl_sim.bench.converge import Convergence
from fl_sim.bench.pretrain import Pretraining
from fl_sim.data.breast_cancer import load_breast_cancer_records
from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization, fitted_normalization, to_unit
from fl_sim.data.records import RecordSet
from fl_sim.model import NUM_CLASSES

# Where a case's samples come from: the bench's images (its --data), or a tabular set that
# ships offline.
IMAGES = "images"
TABULAR: dict[str, Callable[[], RecordSet]] = {"breast-cancer": load_breast_cancer_records}
DATASETS = (IMAGES, *TABULAR)


@dataclass(frozen=True)
class AttackCase:
    """One setting to attack over several seeds.

    Parameters
    ----------
    name
        Row label.
    batch_size, width, depth
        B, m and the network depth.
    training
        The client's local training (defence).
    attack
        SPEAR++ settings.
    seeds
        One batch, network and search per seed.
    knows_batch_size, knows_noise
        What the client declared and the attacker may use (without the noise level, the attack
        fits it to the gradient's spectrum).
    pretrain
        Training of the network before the client's round (none: at initialisation).
    converged
        Training of the network on a whole training split before the client's round (the
        bench then needs one; ``None``: not).
    own_images
        Attack a batch of the images ``converged`` trained on (what a client sends late in a
        federation, its data memorised), not of unseen test images.
    dtype
        The client's precision (``None``: the bench's ``--dtype``).
    arrays
        How the update reaches the attack: ``tensors`` (as the client computed it, in its
        dtype), ``float64`` (widened to float64 numpy arrays, as numpy code hands a float32
        update over) or ``float64-diff`` ((sent - received) / lr computed in float64 from the
        client's weights, as the audit does).
    paper
        The paper's figure for this row, for the side-by-side table ('' when none).
    centred
        The images normalised by CIFAR-10's channel statistics, as the simulation feeds them;
        ``False``: on [0, 1], as torchvision's ``ToTensor()`` gives them with no ``Normalize``
        (the mean image then dominates every pre-activation). Tabular records: standardised
        by their set's per-feature mean and std; ``False``: min-max scaled to [0, 1].
    dataset
        ``images`` (the bench's ``--data``) or a tabular set of :data:`TABULAR`.
    """

    name: str
    batch_size: int
    width: int
    depth: int = 6
    training: TrainingSettings = field(default_factory=training_settings)
    attack: SpearConfig = field(default_factory=SpearConfig)
    seeds: tuple[int, ...] = (0,)
    knows_batch_size: bool = False
    knows_noise: bool = True
    pretrain: Pretraining = field(default_factory=Pretraining)
    converged: Convergence | None = None
    own_images: bool = False
    dtype: str | None = None
    arrays: str = "tensors"
    paper: str = ""
    centred: bool = True
    dataset: str = IMAGES

    def samples(self, images: ImageSet | None) -> RecordSet:
        """The records this case's batches are drawn from: ``images`` (the bench's), or its
        tabular set."""
        if self.dataset != IMAGES:
            return _tabular(self.dataset)
        if images is None:
            raise ValueError(f"case {self.name!r} attacks images: pass the bench's images")
        return RecordSet.from_images(images, NUM_CLASSES)

    def normalization(self, centred: Normalization) -> Normalization:
        """The inputs' normalisation: ``centred`` (the bench's, for images) or a tabular set's
        own standardisation; none (samples on their [0, 1] scale) for an un-centred case."""
        if self.dataset != IMAGES:
            centred = _standardisation(self.dataset)
        if self.centred:
            return centred
        entries = len(centred.mean)
        return Normalization((0.0,) * entries, (1.0,) * entries, centred.ndim)

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset={self.dataset!r}: allowed are {', '.join(DATASETS)}")
        if self.converged is not None and self.dataset != IMAGES:
            raise ValueError(
                f"case {self.name!r}: converged networks train on the bench's images; "
                f"dataset {self.dataset!r} has no such split"
            )
        if self.arrays not in ARRAYS:
            raise ValueError(f"arrays={self.arrays!r}: allowed are {', '.join(ARRAYS)}")
        if self.dtype not in (None, "float32", "float64"):
            raise ValueError(f"dtype={self.dtype!r}: allowed are float32, float64 or None")
        if self.converged is not None and self.pretrain.steps:
            raise ValueError(
                f"case {self.name!r}: pretrain and converged both train the network; set one"
            )
        if self.own_images and self.converged is None:
            raise ValueError(
                f"case {self.name!r}: own_images attacks the images converged trained on; "
                "set converged"
            )


ARRAYS = ("tensors", "float64", "float64-diff")


@cache
def _tabular(name: str) -> RecordSet:
    return TABULAR[name]()


@cache
def _standardisation(name: str) -> Normalization:
    """A tabular set's per-feature mean and std over all its records (on its [0, 1] scale)."""
    records = _tabular(name)
    return fitted_normalization(to_unit(records.records, records.low, records.high, torch.float64))


_DP_SMALL = training_settings("dp", lr=0.01, clip=2.0, noise_multiplier=1e-4)
_DP_LARGE = training_settings("dp", lr=0.01, clip=2.0, noise_multiplier=1e-6)
_FEDAVG_SMALL = training_settings("fedavg", lr=0.01, epochs=3, mini_batch=5)
_FEDAVG_LARGE = training_settings("fedavg", lr=0.01, epochs=15, mini_batch=30)

# Rows of the SPEAR++ paper's tables as summarised in SPEARPP.md.
PAPER: tuple[AttackCase, ...] = (
    AttackCase("l1 RAdam B=100 m=4000", 100, 4000, paper="PSNR 124.24, 100%"),
    AttackCase("l1 RAdam B=150 m=4000", 150, 4000, paper="PSNR 120.86, 100%"),
    AttackCase("l1 RAdam B=210 m=4000", 210, 4000, paper="PSNR 45.34, 7%"),
    AttackCase(
        "l1 PGD B=210 m=4000",
        210,
        4000,
        attack=SpearConfig(optimiser="pgd"),
        paper="PSNR 88.36, 77%",
    ),
    AttackCase("l1 RAdam B=20 m=200", 20, 200, paper="PSNR 120.98, 95%"),
    AttackCase(
        "l1 PGD B=20 m=200", 20, 200, attack=SpearConfig(optimiser="pgd"), paper="PSNR 41.53, 25%"
    ),
    AttackCase("l1 RAdam B=65 m=1000", 65, 1000, paper="PSNR 125.18, 100%"),
    AttackCase(
        "l1 PGD B=65 m=1000", 65, 1000, attack=SpearConfig(optimiser="pgd"), paper="PSNR 93.91, 93%"
    ),
    AttackCase(
        "LogCosh B=20 m=200",
        20,
        200,
        attack=SpearConfig(surrogate="logcosh"),
        paper="PSNR 121.50, 98%",
    ),
    AttackCase(
        "-l4 B=20 m=200", 20, 200, attack=SpearConfig(surrogate="l4"), paper="PSNR 14.29, 0%"
    ),
    AttackCase(
        "DP C=2 sigma=1e-4 B=20 m=200", 20, 200, training=_DP_SMALL, paper="PSNR 31.90, 75%"
    ),
    AttackCase(
        "DP C=2 sigma=1e-6 B=150 m=4000", 150, 4000, training=_DP_LARGE, paper="PSNR 55.45, 88%"
    ),
    AttackCase(
        "FedAvg E=3 b=5 lr=1e-2 B=20 m=200",
        20,
        200,
        training=_FEDAVG_SMALL,
        paper="PSNR 67.81, 75%",
    ),
    AttackCase(
        "FedAvg E=15 b=30 lr=1e-2 B=150 m=4000",
        150,
        4000,
        training=_FEDAVG_LARGE,
        paper="PSNR 63.71, 92%",
    ),
)


def _with(case: AttackCase, **changes: object) -> AttackCase:
    return AttackCase(**{**case.__dict__, **changes})


def _paper_method(case: AttackCase) -> AttackCase:
    cfg = paper_config(case.attack.surrogate, case.attack.optimiser)
    return _with(case, name=case.name + " [paper method]", attack=cfg)


# The must-show rows of the engine issue: seeds as asked there.
ENGINE: tuple[AttackCase, ...] = (
    _with(PAPER[4], seeds=tuple(range(10))),
    _with(PAPER[6], seeds=tuple(range(5))),
    _with(PAPER[0], seeds=(0, 1, 2)),
    _with(PAPER[1], seeds=(0, 1, 2)),
    _with(PAPER[2], seeds=(0,)),
    _with(PAPER[10], seeds=tuple(range(10))),
    _with(PAPER[12], seeds=tuple(range(10))),
)

# Depth 2 (one hidden layer into the head) is not a target of the engine; measured and reported.
SHALLOW: tuple[AttackCase, ...] = (
    AttackCase("depth 2 l1 RAdam B=20 m=200", 20, 200, depth=2, seeds=(0, 1, 2, 3, 4)),
    AttackCase("depth 2 l1 RAdam B=50 m=1000", 50, 1000, depth=2, seeds=(0, 1, 2)),
)

# The engine without the next layer's gradient: scales from the first layer's bias gradient.
_BIAS_ONLY = SpearConfig(next_layer_scale=False)

# The must-show rows of the "beyond the paper" issue, run with the default (sign-consistency)
# search; labels keep the paper's row; the DP sigma=1e-4 row also with the first layer's scales.
BEYOND: tuple[AttackCase, ...] = tuple(
    _with(case, name=case.name.replace("l1 RAdam", "signs"), seeds=seeds)
    for case, seeds in (
        (PAPER[2], (0, 1, 2)),
        (AttackCase("l1 RAdam B=256 m=4000", 256, 4000, paper="(not in the paper)"), (0, 1, 2)),
        (PAPER[10], tuple(range(10))),
        (
            _with(
                PAPER[10], name=PAPER[10].name + " [scales: first layer only]", attack=_BIAS_ONLY
            ),
            tuple(range(10)),
        ),
        (PAPER[12], tuple(range(10))),
        (PAPER[11], (0, 1, 2)),
        (PAPER[13], (0, 1, 2)),
        (SHALLOW[0], tuple(range(5))),
        (SHALLOW[1], tuple(range(5))),
    )
)

# Trained networks (the audit's later rounds): the must-show rows of the trained-network issue.
_TRAINED_SMALL = tuple(
    _with(case, name=case.name + pre.label, pretrain=pre, seeds=tuple(range(20)))
    for pre in (Pretraining(300), Pretraining(1000))
    for case in (AttackCase("signs B=20 m=200", 20, 200), AttackCase("signs B=50 m=1000", 50, 1000))
)
TRAINED: tuple[AttackCase, ...] = (
    *_TRAINED_SMALL,
    _with(
        PAPER[0],
        name="signs B=100 m=4000" + Pretraining(300).label,
        pretrain=Pretraining(300),
        seeds=(0, 1, 2),
    ),
)


def noise_blind(case: AttackCase) -> AttackCase:
    """``case`` with the noise level not told to the attacker (it fits it to the spectrum)."""
    return _with(case, name=case.name + " [noise not told]", knows_noise=False)


# The must-show rows of the noise-blind issue: DP noise not told (the next layer's gradient given
# as before), and a float32 client's update handed over as float64 arrays.
_FLOAT32_FEDSGD = AttackCase("float32 FedSGD B=20 m=200", 20, 200, dtype="float32")
NOISE_BLIND: tuple[AttackCase, ...] = (
    noise_blind(_with(PAPER[10], seeds=tuple(range(10)))),
    _with(PAPER[10], seeds=tuple(range(10))),
    _with(
        _FLOAT32_FEDSGD,
        name=_FLOAT32_FEDSGD.name + " [float64 arrays]",
        arrays="float64",
        seeds=tuple(range(10)),
    ),
    _with(
        _FLOAT32_FEDSGD,
        name=_FLOAT32_FEDSGD.name + " [float64 difference]",
        arrays="float64-diff",
        seeds=tuple(range(10)),
    ),
    _with(
        _FLOAT32_FEDSGD, name=_FLOAT32_FEDSGD.name + " [float32 tensors]", seeds=tuple(range(10))
    ),
    noise_blind(_with(PAPER[11], seeds=(0, 1, 2))),
)

# Un-centred inputs ([0, 1] pixels, no Normalize) beside the same images centred, on PyTorch's
# default initialisation with one hidden layer more than the head's (depth 3), 60 s an attack
# (what fails runs every pass otherwise).
UNCENTRED: tuple[AttackCase, ...] = tuple(
    AttackCase(
        f"{'centred' if centred else '[0, 1]'} B={b} m={m}",
        b,
        m,
        depth=3,
        attack=SpearConfig(time_budget_s=60.0),
        seeds=(0, 1, 2),
        centred=centred,
    )
    for b, m in ((10, 256), (20, 256), (50, 1000), (100, 1000))
    for centred in (True, False)
)

# Networks trained on the whole training split (every image but the test split's, which the
# attacked batches come from: images the network never saw), depth 6 as in the paper's rows,
# 300 s an attack (the batches past the trained limit run every pass otherwise).
_CONVERGED = Convergence()
CONVERGED: tuple[AttackCase, ...] = tuple(
    AttackCase(
        f"signs B={b} m={m}" + _CONVERGED.label,
        b,
        m,
        attack=SpearConfig(time_budget_s=300.0),
        seeds=(0, 1, 2),
        converged=_CONVERGED,
    )
    for b, m in ((20, 200), (30, 200), (50, 1000), (100, 1000), (150, 1000))
)

# Networks trained until they hold their training images (the issue asks for a training
# accuracy of at least 0.95), attacked on batches of those images and of unseen ones; 120 s an
# attack.
_MEMORISED = Convergence(epochs=60)
MEMORISED: tuple[AttackCase, ...] = tuple(
    AttackCase(
        f"signs B={b} m=200" + _MEMORISED.label + (" own images" if own else " unseen images"),
        b,
        200,
        attack=SpearConfig(time_budget_s=120.0),
        seeds=(0, 1, 2),
        converged=_MEMORISED,
        own_images=own,
    )
    for b in (20, 30)
    for own in (True, False)
)

# Tabular records (30 features, so B < 30) min-max scaled to [0, 1] beside the same records
# standardised, float64 and float32 clients, depth 6 at PyTorch's initialisation; 60 s an
# attack.
TABULAR_CASES: tuple[AttackCase, ...] = tuple(
    AttackCase(
        f"breast-cancer {'standardised' if centred else 'min-max'} B={b} m={m}"
        + (f" {dtype}" if dtype else ""),
        b,
        m,
        attack=SpearConfig(time_budget_s=60.0),
        seeds=(0, 1, 2),
        centred=centred,
        dataset="breast-cancer",
        dtype=dtype,
    )
    for b, m, dtype in (
        (10, 256, None),
        (20, 256, None),
        (25, 256, None),
        (28, 256, None),
        (20, 1000, None),
        (28, 1000, None),
        (28, 4000, None),
        (20, 256, "float32"),
        (28, 1000, "float32"),
    )
    for centred in (True, False)
)

QUICK: tuple[AttackCase, ...] = (
    AttackCase("quick l1 RAdam B=20 m=200", 20, 200, seeds=(0, 1)),
    _paper_method(AttackCase("quick l1 RAdam B=20 m=200", 20, 200, seeds=(0, 1))),
)

PRESETS: dict[str, tuple[AttackCase, ...]] = {
    "quick": QUICK,
    "paper": PAPER,
    "paper-method": tuple(_paper_method(c) for c in PAPER),
    "engine": ENGINE,
    "shallow": SHALLOW,
    "beyond": BEYOND,
    "trained": TRAINED,
    "noise-blind": NOISE_BLIND,
    "uncentred": UNCENTRED,
    "converged": CONVERGED,
    "memorised": MEMORISED,
    "tabular": TABULAR_CASES,
}
