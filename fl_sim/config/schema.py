"""The typed, immutable scenario: what a run simulates.

Every table is a frozen pydantic model that declares its keys once, with their types, defaults
and allowed values; :mod:`fl_sim.config.load` reads TOML into them and turns pydantic's errors
into messages naming the dotted key, the value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

import torch
from pydantic import BaseModel, Field, SerializeAsAny, field_validator, model_validator
from torch import nn

from attacks import ATTACKS, AttackTable
from clients.defences import DefenceSettings, TrainingSettings
from fl_sim.config.federation import FederationSpec
from fl_sim.data.description import DataDescription
from fl_sim.data.spec import DataSpec
from fl_sim.executors.budget import GB, IDLE_WORKER_BYTES
from fl_sim.executors.cluster import ClusterSpec, CpuAmount, GpuAmount
from fl_sim.model import array_keys, fc_relu_net, first_linear
from flsim_plugins.settings import (
    AtLeastOne,
    Bool,
    Ids,
    Int,
    Names,
    Positive,
    Settings,
    Str,
    distinct,
)
from flsim_plugins.tables import PluginTables
from strategies.behaviours import BEHAVIOURS, BehaviourSettings


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


class AuditSpec(PluginTables):
    """What the honest-but-curious server attacks, with what knowledge and budget.

    Parameters
    ----------
    enabled
        Intercept and attack at all.
    rounds, clients
        Which rounds and client ids to attack (empty: all).
    attacks
        Attacks to run, by registry name (``attacks.ATTACKS``): ``spearpp``, ``inversion``,
        ``analytic``. Each registered attack has a table of its own, ``[audit.<name>]``, with
        its targets within the audit's and its settings (:meth:`table`): SPEAR++'s budget in
        ``[audit.spearpp]``, the optimisation attack's losses and optimiser in
        ``[audit.inversion]``.
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
    workers
        Attack processes working beside the federation.
    wait_s
        After the last round, how long to wait for unfinished attacks before recording them
        as timed out.
    max_memory_gb
        The memory the attack workers on this machine may take together, idle workers
        included (GB; unset: half the machine's memory). Each attack's peak is estimated before
        it starts: one that does not fit beside those running waits for them, one that does
        not fit alone is recorded ``out_of_memory`` with its estimate (``fl-sim audit RUN_DIR
        --max-memory-gb ...`` redoes it), and the federation goes on.
    grids
        Save an image grid (originals over reconstructions) per record.
    keep_updates
        Keep every attacked update under ``updates/`` for good, so ``fl-sim audit RUN_DIR`` can
        redo the audit (about 4.7 MB per client and round at m = 200; the whole model's arrays
        too where a whole-model attack or the proxies need them). Without it each update is
        stored only until its last record is written: a run killed mid-audit keeps what was
        still queued, and ``fl-sim audit RUN_DIR`` resumes it.
    """

    enabled: Bool = True
    rounds: Ids = ()
    clients: Ids = ()
    attacks: Names = ("spearpp",)
    proxies: Bool = False
    proxy_tol: Positive = 1e-8
    proxy_max_iter: AtLeastOne = 300
    knows_batch_size: Bool = False
    knows_noise: Bool = True
    knows_labels: Bool = False
    workers: AtLeastOne = 1
    wait_s: Positive = 600.0
    max_memory_gb: Positive | None = None
    grids: Bool = True
    keep_updates: Bool = False

    # SPEAR++'s budget had its place in [audit] before each attack had a table.
    moved: ClassVar[Mapping[str, str]] = {
        key: f"[audit.spearpp] {key}"
        for key in ("starts", "steps", "max_passes", "time_budget_s", "budget_clock")
    }

    @classmethod
    def plugin_tables(cls) -> Mapping[str, type[BaseModel]]:
        return {name: attack.Table for name, attack in ATTACKS.items()}

    @field_validator("attacks")
    @classmethod
    def _attacks(cls, attacks: tuple[str, ...]) -> tuple[str, ...]:
        return distinct(attacks, tuple(sorted(ATTACKS)))

    @model_validator(mode="after")
    def _budget_holds_workers(self) -> AuditSpec:
        idle = self.workers * IDLE_WORKER_BYTES
        if self.max_memory_gb is not None and self.max_memory_gb * GB <= idle:
            raise ValueError(
                f"audit.max_memory_gb={self.max_memory_gb} does not hold audit.workers="
                f"{self.workers} idle attack workers ({IDLE_WORKER_BYTES / GB:.1f} GB each): "
                f"allowed is more than {idle / GB:.1f}"
            )
        return self

    @property
    def targets(self) -> AttackTable:
        """The audit's rounds and clients."""
        return AttackTable(rounds=self.rounds, clients=self.clients)

    def covers(self, attack: str, server_round: int, client: int) -> bool:
        """Whether ``attack`` runs on this client's update of this round."""
        table = self.table(attack)
        assert isinstance(table, AttackTable)
        return self.targets.covers(server_round, client) and table.covers(server_round, client)


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
        tables: dict[str, Any] = {"audit": self.audit}
        tables.update({f"audit.{name}": self.audit.table(name) for name in ATTACKS})
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
        refusal = behaviour.refuses(server, len(self.clients))
        if refusal is not None:
            raise ValueError(refusal)
        if behaviour.per_client and self.federation.central_dp is not None:
            raise ValueError(
                f"server.behaviour = {behaviour.name!r} with [federation.central_dp]: it sends "
                "clients different models, and Flower's central DP wrappers clip every update "
                "against one; drop one of them"
            )
        return self
