"""The typed, immutable scenario: what a run simulates.

Every table is a frozen pydantic model that declares its keys once, with their types, defaults
and allowed values; :mod:`fl_sim.config.load` reads TOML into them and turns pydantic's errors
into messages naming the dotted key, the value and what is allowed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field, SerializeAsAny, field_validator, model_validator
from torch import nn

from attacks import ATTACKS
from attacks.inversion import LOSSES, InversionConfig, InversionSettings
from clients.defences import DefenceSettings, TrainingSettings
from fl_sim.config.federation import FederationSpec
from fl_sim.data.description import DataDescription
from fl_sim.data.spec import DataSpec
from fl_sim.executors.cluster import ClusterSpec, CpuAmount, GpuAmount
from fl_sim.model import array_keys, fc_relu_net, first_linear
from flsim_plugins.settings import AtLeastOne, Bool, Ids, Int, Names, Positive, Settings, Str
from strategies.behaviours import BEHAVIOURS, BehaviourSettings


def _distinct(value: tuple[str, ...], allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A non-empty list of distinct names out of ``allowed``."""
    if not value or set(value) - set(allowed) or len(set(value)) != len(value):
        raise ValueError(f"allowed are {', '.join(allowed)}, each at most once (at least one)")
    return value


class ModelSpec(Settings):
    """The FC ReLU network: first layer width m, depth (number of linear layers) and dtype.

    ``float64`` (the default) keeps the measured leakage the defence's own; with ``float32`` the
    weights a client returns carry round-off that the server sees as a little noise.
    """

    width: AtLeastOne = 200
    depth: Annotated[Int, Field(ge=2)] = 6
    dtype: Literal["float64", "float32"] = "float64"

    def build(self, data: DataDescription) -> nn.Sequential:
        """A freshly initialised network of this shape and dtype for inputs described by
        ``data`` (its input size and number of classes)."""
        net = fc_relu_net(self.width, self.depth, data.input_dim, data.num_classes)
        return net.to(getattr(torch, self.dtype))

    def attacked_layer(self, data: DataDescription) -> tuple[str, str]:
        """ArrayRecord keys of the first linear layer, the one SPEAR++ attacks (and the one
        whose rank tells the optimisation attack the batch size)."""
        name, _ = first_linear(self.build(data))
        return array_keys(name)


class ClientSpec(Settings):
    """One client: its training defence, its update mods and how much of its data it uses.

    Parameters
    ----------
    training
        The training defence's settings (``fedsgd``, ``fedavg``, ``dp``, ...).
    batch_size
        B: samples drawn from the local set each round (the batch the attack targets).
    mods
        Settings of the update mods applied to its reply, in the order they are applied.
    """

    training: SerializeAsAny[TrainingSettings]
    batch_size: AtLeastOne = 20
    mods: tuple[SerializeAsAny[DefenceSettings], ...] = ()

    @property
    def defences(self) -> tuple[str, ...]:
        """Its training defence's name, then its update mods'."""
        return (self.training.defence, *(m.defence for m in self.mods))


class AttackTargets(Settings):
    """Which audited rounds and clients one attack runs on (empty: every audited one).

    An attack runs on a client's update of a round when the audit targets it (``audit.rounds``,
    ``audit.clients``) and so does the attack's own table (``[audit.spearpp]``,
    ``[audit.inversion]``).
    """

    rounds: Ids = ()
    clients: Ids = ()

    @model_validator(mode="before")
    @classmethod
    def _only_targets(cls, data: Any) -> Any:
        if isinstance(data, dict) and set(data) - {"rounds", "clients"}:
            raise ValueError(
                "a table of rounds, clients (SPEAR++'s budget keys starts, steps, ... stay in "
                "[audit])"
            )
        return data

    def covers(self, server_round: int, client: int) -> bool:
        """Whether (round, client) is in these targets."""
        return (not self.rounds or server_round in self.rounds) and (
            not self.clients or client in self.clients
        )


class InversionSpec(Settings, InversionSettings):
    """Where and how the optimisation-based attack runs (``[audit.inversion]``).

    Parameters
    ----------
    rounds, clients
        Its targets within the audit's (empty: all).
    losses
        Gradient distances, one attack per loss: ``cosine`` and/or ``l2``.
    restarts, iterations, lr, tv, signed, dtype, device
        How it optimises: :class:`attacks.inversion.InversionSettings`, declared there.
    """

    model_config = Settings.model_config
    rounds: Ids = ()
    clients: Ids = ()
    losses: Names = ("cosine",)

    @field_validator("losses")
    @classmethod
    def _losses(cls, losses: tuple[str, ...]) -> tuple[str, ...]:
        return _distinct(losses, LOSSES)

    def config(self, loss: str, seed: int) -> InversionConfig:
        """The attack's settings for one run: this table's, with its loss and seed."""
        shared = self.model_dump(include=set(InversionSettings.model_fields))
        return InversionConfig.model_validate({**shared, "loss": loss, "seed": seed})

    @property
    def targets(self) -> AttackTargets:
        """Its rounds and clients."""
        return AttackTargets(rounds=self.rounds, clients=self.clients)


class AuditSpec(Settings):
    """What the honest-but-curious server attacks, with what knowledge and budget.

    Parameters
    ----------
    enabled
        Intercept and attack at all.
    rounds, clients
        Which rounds and client ids to attack (empty: all).
    attacks
        Attacks to run, by registry name (``attacks.ATTACKS``): ``spearpp``, ``inversion``,
        ``analytic``.
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
    budget_clock
        What the time budget counts: ``cpu`` (the attack's own CPU seconds per torch thread,
        so attacks running beside the federation, or a busy machine, do not cut it short) or
        ``wall`` seconds.
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

    enabled: Bool = True
    rounds: Ids = ()
    clients: Ids = ()
    attacks: Names = ("spearpp",)
    spearpp: AttackTargets = AttackTargets()
    inversion: InversionSpec = InversionSpec()
    proxies: Bool = False
    proxy_tol: Positive = 1e-8
    proxy_max_iter: AtLeastOne = 300
    knows_batch_size: Bool = False
    knows_noise: Bool = True
    knows_labels: Bool = False
    starts: AtLeastOne = 2000
    steps: AtLeastOne = 1000
    max_passes: AtLeastOne = 4
    time_budget_s: Positive = 30.0
    budget_clock: Literal["cpu", "wall"] = "cpu"
    workers: AtLeastOne = 1
    wait_s: Positive = 600.0
    grids: Bool = True
    keep_updates: Bool = False

    @field_validator("attacks")
    @classmethod
    def _attacks(cls, attacks: tuple[str, ...]) -> tuple[str, ...]:
        return _distinct(attacks, tuple(sorted(ATTACKS)))

    @property
    def targets(self) -> AttackTargets:
        """The audit's rounds and clients."""
        return AttackTargets(rounds=self.rounds, clients=self.clients)


class ResourcesSpec(Settings):
    """Ray resources of each simulated client (``[resources]``): ``client_cpus`` > 0 (Flower
    fits node CPUs / client_cpus clients on each node) and ``client_gpus``, a share of one GPU
    or whole GPUs."""

    client_cpus: Annotated[CpuAmount, Field(gt=0)] = 1.0
    client_gpus: GpuAmount = 0.0


class ServerSpec(Settings):
    """What the server sends (``[server]``): its behaviour's settings, ``honest`` (the global
    model unchanged) by default, or a dishonest one of :data:`strategies.behaviours.BEHAVIOURS`
    (``[server] behaviour = "sparsify"``, its settings in ``[server.sparsify]``)."""

    behaviour: SerializeAsAny[BehaviourSettings] = BEHAVIOURS["honest"].Settings()


class Scenario(Settings):
    """A whole run: rounds, seed, data, model, one spec per client, what the server sends, the
    audit, where the work runs (each simulated client's Ray resources, the cluster), and the
    federation-wide defence, if any (``[federation]``: SecAgg+ or central DP)."""

    name: Str = "scenario"
    rounds: AtLeastOne = 3
    seed: Int = 0
    data: DataSpec = DataSpec()
    model: ModelSpec = ModelSpec()
    clients: tuple[ClientSpec, ...]
    server: ServerSpec = ServerSpec()
    audit: AuditSpec = AuditSpec()
    resources: ResourcesSpec = ResourcesSpec()
    cluster: ClusterSpec = ClusterSpec()
    federation: FederationSpec = FederationSpec()

    @property
    def client_cpus(self) -> float:
        """CPUs each simulated client reserves."""
        return self.resources.client_cpus

    @property
    def client_gpus(self) -> float:
        """GPUs (or a share of one) each simulated client reserves."""
        return self.resources.client_gpus

    @model_validator(mode="after")
    def _within_the_run(self) -> Scenario:
        """Batches within the local sets; attack targets within the rounds and clients; SecAgg+'s
        cohort and threshold; the server behaviour's own conditions."""
        for spec in self.clients:
            if spec.batch_size > self.data.samples_per_client:
                raise ValueError(
                    f"a client's batch_size = {spec.batch_size} exceeds "
                    f"data.samples_per_client = {self.data.samples_per_client}"
                )
        tables = {
            "audit": self.audit,
            "audit.spearpp": self.audit.spearpp,
            "audit.inversion": self.audit.inversion,
        }
        limits = {"rounds": (1, self.rounds), "clients": (0, len(self.clients) - 1)}
        for table, targets in tables.items():
            for key, (low, high) in limits.items():
                ids = getattr(targets, key)
                bad = [i for i in ids if not low <= i <= high]
                if bad:
                    raise ValueError(f"{table}.{key} = {list(ids)}: {bad} outside {low}..{high}")
        secagg = self.federation.secagg
        if secagg is not None:
            count = len(self.clients)
            if count < 2:
                raise ValueError(
                    f"federation.secagg with clients.count = {count}: SecAgg+ sums at least 2 "
                    "clients"
                )
            threshold = secagg.reconstruction_threshold
            if isinstance(threshold, int) and threshold > count:
                raise ValueError(
                    f"federation.secagg.reconstruction_threshold = {threshold}: at most "
                    f"clients.count = {count} (a secret needs that many of its neighbours' shares)"
                )
        server = self.server.behaviour
        behaviour = BEHAVIOURS[server.behaviour]
        refusal = behaviour.refuses(server, len(self.clients), secagg is not None)
        if refusal is not None:
            raise ValueError(refusal)
        return self
