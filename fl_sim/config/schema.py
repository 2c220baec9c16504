"""The typed, immutable scenario: what a run simulates."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from clients import LocalTraining
from fl_sim.config.cluster import ClusterSpec
from fl_sim.config.federation import FederationSpec
from fl_sim.data.description import DataDescription
from fl_sim.model import fc_relu_net


@dataclass(frozen=True)
class DataSpec:
    """Where the records come from and how they are split.

    Parameters
    ----------
    source
        ``auto`` (CIFAR-10 if found, else the offline photographs), ``cifar10``, ``photos``
        (images), or ``breast_cancer`` (scikit-learn's tabular medical records, 30 features).
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
    """The FC ReLU network: first layer width m, depth (number of linear layers) and dtype.

    ``float64`` (the default) keeps the measured leakage the defence's own; with ``float32`` the
    weights a client returns carry round-off that the server sees as a little noise.
    """

    width: int = 200
    depth: int = 6
    dtype: str = "float64"

    def build(self, data: DataDescription) -> nn.Sequential:
        """A freshly initialised network of this shape and dtype for inputs described by
        ``data`` (its input size and number of classes)."""
        net = fc_relu_net(self.width, self.depth, data.input_dim, data.num_classes)
        return net.to(getattr(torch, self.dtype))


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
class AttackTargets:
    """Which audited rounds and clients one attack runs on (empty: every audited one).

    An attack runs on a client's update of a round when the audit targets it (``audit.rounds``,
    ``audit.clients``) and so does the attack's own table (``[audit.spearpp]``,
    ``[audit.inversion]``).
    """

    rounds: tuple[int, ...] = ()
    clients: tuple[int, ...] = ()

    def covers(self, server_round: int, client: int) -> bool:
        """Whether (round, client) is in these targets."""
        return (not self.rounds or server_round in self.rounds) and (
            not self.clients or client in self.clients
        )


@dataclass(frozen=True)
class InversionSpec:
    """Where and how the optimisation-based attack runs (``[audit.inversion]``).

    Parameters
    ----------
    rounds, clients
        Its targets within the audit's (empty: all).
    losses
        Gradient distances, one attack per loss: ``cosine`` and/or ``l2``.
    restarts, iterations, lr, tv, signed, dtype, device
        As in :class:`attacks.InversionConfig`.
    """

    rounds: tuple[int, ...] = ()
    clients: tuple[int, ...] = ()
    losses: tuple[str, ...] = ("cosine",)
    restarts: int = 2
    iterations: int = 1000
    lr: float = 0.1
    tv: float = 1e-4
    signed: bool = True
    dtype: str = "float32"
    device: str = "auto"

    @property
    def targets(self) -> AttackTargets:
        """Its rounds and clients."""
        return AttackTargets(self.rounds, self.clients)


@dataclass(frozen=True)
class AuditSpec:
    """What the honest-but-curious server attacks, with what knowledge and budget.

    Parameters
    ----------
    enabled
        Intercept and attack at all.
    rounds, clients
        Which rounds and client ids to attack (empty: all).
    attacks
        Attacks to run, by registry name (``attacks.ATTACKS``): ``spearpp``, ``inversion``.
    spearpp
        SPEAR++'s own targets within the audit's (``[audit.spearpp]``).
    inversion
        The optimisation attack's targets and settings (``[audit.inversion]``).
    proxies
        Compute each attacked sample's vulnerability proxies (gradient norm, LAVP) at the
        ground truth (``proxies.jsonl``; with the inversion attack, ``forecast.jsonl``).
    proxy_tol, proxy_max_iter
        Lanczos tolerance and cap per LAVP eigenvalue search.
    knows_batch_size
        The attacker may use the batch size the client declares (else it estimates it).
    knows_noise
        The attacker may use the DP noise level the client declares (and the server's estimate
        of the weights' rounding); else it is given no noise level and fits it to the gradient's
        spectrum.
    knows_labels
        The inversion attack is told the batch's labels (else it recovers them from the
        head's gradient).
    starts, steps, max_passes, time_budget_s
        SPEAR++ budget per reconstruction (the time budget stops new passes).
    workers
        Attack processes working beside the federation.
    wait_s
        After the last round, how long to wait for unfinished attacks before recording them
        as timed out.
    grids
        Save an image grid (originals over reconstructions) per record.
    keep_updates
        Save every intercepted update under ``updates/`` so ``fl-sim audit RUN_DIR`` can resume
        an interrupted audit or redo it (about 4.7 MB per client and round at m = 200; the
        whole model's arrays too where a whole-model attack or the proxies need them).
    """

    enabled: bool = True
    rounds: tuple[int, ...] = ()
    clients: tuple[int, ...] = ()
    attacks: tuple[str, ...] = ("spearpp",)
    spearpp: AttackTargets = AttackTargets()
    inversion: InversionSpec = InversionSpec()
    proxies: bool = False
    proxy_tol: float = 1e-8
    proxy_max_iter: int = 300
    knows_batch_size: bool = False
    knows_noise: bool = True
    knows_labels: bool = False
    starts: int = 2000
    steps: int = 1000
    max_passes: int = 4
    time_budget_s: float = 30.0
    workers: int = 1
    wait_s: float = 600.0
    grids: bool = True
    keep_updates: bool = False

    @property
    def targets(self) -> AttackTargets:
        """The audit's rounds and clients."""
        return AttackTargets(self.rounds, self.clients)


@dataclass(frozen=True)
class Scenario:
    """A whole run: rounds, seed, data, model, one spec per client, the audit, where the work
    runs (each simulated client's Ray resources, the cluster), and the federation-wide
    defence, if any (``[federation]``: SecAgg+ or central DP)."""

    name: str
    rounds: int
    seed: int
    data: DataSpec
    model: ModelSpec
    clients: tuple[ClientSpec, ...]
    audit: AuditSpec = AuditSpec()
    client_cpus: float = 1.0
    client_gpus: float = 0.0
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    federation: FederationSpec = field(default_factory=FederationSpec)
