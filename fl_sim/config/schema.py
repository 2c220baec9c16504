"""The typed, immutable scenario: what a run simulates."""

from __future__ import annotations

from dataclasses import dataclass

from clients import LocalTraining


@dataclass(frozen=True)
class DataSpec:
    """Where images come from and how they are split.

    Parameters
    ----------
    source
        ``auto`` (CIFAR-10 if found, else the offline photographs), ``cifar10`` or ``photos``.
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
    """

    source: str = "auto"
    cifar10_dir: str = "~/.cache/fl-sim/cifar10"
    download: bool = False
    partition: str = "iid"
    alpha: float = 0.5
    samples_per_client: int = 64
    test_size: int = 500


@dataclass(frozen=True)
class ModelSpec:
    """The FC ReLU network: first layer width m and depth (number of linear layers)."""

    width: int = 200
    depth: int = 6


@dataclass(frozen=True)
class ClientSpec:
    """One client: its local training (defence) and how much of its data it uses per round.

    Parameters
    ----------
    training
        Defence and its settings.
    batch_size
        B: samples drawn from the local set each round (the batch the attack targets).
    delta
        DP delta for the epsilon accountant.
    """

    training: LocalTraining
    batch_size: int = 20
    delta: float = 1e-5


@dataclass(frozen=True)
class Scenario:
    """A whole run: rounds, seed, data, model and one spec per client."""

    name: str
    rounds: int
    seed: int
    data: DataSpec
    model: ModelSpec
    clients: tuple[ClientSpec, ...]
    client_cpus: float = 1.0
    client_gpus: float = 0.0
