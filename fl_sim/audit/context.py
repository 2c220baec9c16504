"""``AuditContext``: everything an :class:`~fl_sim.audit.auditor.Auditor` is built from, made
one way for each kind of run: fl-sim's own federation (:meth:`AuditContext.for_scenario`), a
Flower app of one's own (:meth:`AuditContext.for_app`, no ground truth), and either resumed
from its run directory (:meth:`AuditContext.stored`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from fl_sim import rundir
from fl_sim.config import parse_scenario
from fl_sim.config.schema import AuditSpec, Scenario
from fl_sim.config.upgrade import upgraded_audit, upgraded_scenario
from fl_sim.data.federated import FederatedData, federated_data
from fl_sim.data.normalize import Normalization
from fl_sim.executors import ClusterSpec

Done = frozenset[tuple[int, int, str]]


@dataclass(frozen=True)
class AuditContext:
    """What an audit runs with.

    Attributes
    ----------
    spec
        What to attack, with which attacks, knowledge and budget.
    run_dir
        Where ``audit.jsonl``, ``proxies.jsonl`` and ``grids/`` grow.
    seed
        Seeds the attacks.
    data
        The run's data: only for judging (ground truth), never for attacking (bar the labels
        when ``knows_labels`` grants them, and the input range the server's pipeline fixes).
        ``None`` for a federation whose data the server does not hold (a user's own Flower
        app): attacks that certify what they report run alone, and each record carries what
        the attack itself knows, the judge's metrics ``None``.
    architecture
        The model the server built (its structure; weights are not used): whole-model attacks
        and the proxies need it, and SPEAR++ takes the next layer's gradient from one-step DP
        updates when it knows which layer that is.
    layer
        ArrayRecord keys of the first linear layer's weight and bias.
    done
        (round, client, run) already on file: not attacked again (``run`` is a record's
        attack label, or ``proxies``).
    cluster
        Where the jobs run: its ``attack_executor`` with ``spec.workers`` jobs at once.
    round_epsilon
        Round -> the federation's epsilon after it (central DP): the records' ``epsilon`` where
        a client declares none of its own.
    draws
        (client, round) -> the ids of the samples the client trained on: ground truth for
        judging secure aggregates, whose clients send none (the simulation's own draw).
    input_shape, normalization
        Without ``data``: one input's shape (C x H x W images get grids) and the normalisation
        to undo in them (none: each image stretched to [0, 1]).
    behaviour
        The server behaviour that chose what was sent (``honest``, ``sparsify``, ...): every
        record says it.
    """

    spec: AuditSpec
    run_dir: Path
    seed: int
    data: FederatedData | None = None
    architecture: nn.Module | None = None
    layer: tuple[str, str] = ("weight", "bias")
    done: Done = frozenset()
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    round_epsilon: Callable[[int], float] | None = None
    draws: Callable[[int, int], np.ndarray] | None = None
    input_shape: tuple[int, ...] | None = None
    normalization: Normalization | None = None
    behaviour: str = "honest"

    @classmethod
    def for_scenario(
        cls,
        scenario: Scenario,
        run_dir: Path,
        data: FederatedData | None = None,
        draws: Callable[[int, int], np.ndarray] | None = None,
    ) -> AuditContext:
        """The audit of a run of ``scenario`` (its data loaded unless given)."""
        if data is None:
            data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
        dp = scenario.federation.central_dp
        return cls(
            spec=scenario.audit,
            run_dir=run_dir,
            seed=scenario.seed,
            data=data,
            architecture=scenario.model.build(data.description),
            layer=scenario.model.attacked_layer(data.description),
            cluster=scenario.cluster,
            round_epsilon=dp.epsilon if dp is not None else None,
            draws=draws,
            behaviour=scenario.server.behaviour.behaviour,
        )

    @classmethod
    def for_app(
        cls,
        spec: AuditSpec,
        run_dir: Path,
        seed: int,
        model: nn.Module | None,
        layer: tuple[str, str],
        input_shape: tuple[int, ...] | None = None,
        normalization: Normalization | None = None,
    ) -> AuditContext:
        """The audit of a Flower app of one's own: no ground truth. What a resumed audit needs
        is written to the run's ``audited.json``."""
        run_dir.mkdir(parents=True, exist_ok=True)
        rundir.write_json(
            run_dir / rundir.AUDITED,
            {
                "settings": spec.model_dump(mode="json"),
                "layer": list(layer),
                "input_shape": list(input_shape) if input_shape else None,
                "normalization": asdict(normalization) if normalization is not None else None,
                "seed": seed,
            },
        )
        return cls(
            spec=spec,
            run_dir=run_dir,
            seed=seed,
            architecture=model,
            layer=layer,
            input_shape=input_shape,
            normalization=normalization,
        )

    @classmethod
    def stored(cls, run_dir: Path) -> AuditContext:
        """The audit ``run_dir`` ran, from its ``scenario.json`` (fl-sim's federation) or its
        ``audited.json`` (an app of one's own), stored settings upgraded to today's.

        Raises
        ------
        FileNotFoundError
            When the run holds neither.
        """
        resolved = _resolved(run_dir)
        if resolved is not None:
            return cls.for_scenario(parse_scenario(upgraded_scenario(resolved)), run_dir)
        path = run_dir / rundir.AUDITED
        if not path.is_file():
            raise FileNotFoundError(
                f"{run_dir} has neither {rundir.SCENARIO} nor {rundir.AUDITED}: nothing says "
                "how it was audited"
            )
        kept = rundir.read_json(path)
        norm = kept["normalization"]
        w_key, b_key = kept["layer"]
        return cls(
            spec=AuditSpec.model_validate(upgraded_audit(kept["settings"])),
            run_dir=run_dir,
            seed=int(kept["seed"]),
            layer=(str(w_key), str(b_key)),
            input_shape=tuple(kept["input_shape"]) if kept["input_shape"] else None,
            normalization=Normalization(tuple(norm["mean"]), tuple(norm["std"]), norm["ndim"])
            if norm
            else None,
        )

    def with_memory_budget(self, max_memory_gb: float) -> AuditContext:
        """This context with the attack workers' memory budget set to ``max_memory_gb``.

        Raises
        ------
        pydantic.ValidationError
            For a budget that does not hold the audit's idle workers.
        """
        settings = {**self.spec.model_dump(), "max_memory_gb": max_memory_gb}
        return dataclasses.replace(self, spec=AuditSpec.model_validate(settings))

    def resumed(self, done: Collection[tuple[int, int, str]]) -> AuditContext:
        """This context with ``done`` on file: those are not attacked again."""
        return dataclasses.replace(self, done=frozenset(done))


def _resolved(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / rundir.SCENARIO
    if not path.is_file():
        return None
    resolved: dict[str, Any] | None = rundir.read_json(path).get("resolved")
    return resolved
