"""Reading scenarios: TOML, dotted ``--set`` overrides, and validation with errors that name the
key, the value and what is allowed."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from attacks import ATTACKS, InversionConfig
from attacks.inversion import LOSSES
from clients import TRAINERS, LocalTraining
from fl_sim.config.cluster import ClusterSpec, check_resources
from fl_sim.config.federation import FederationSpec
from fl_sim.config.schema import (
    AttackTargets,
    AuditSpec,
    ClientSpec,
    DataSpec,
    InversionSpec,
    ModelSpec,
    Scenario,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_TOP = {"name": str, "rounds": int, "seed": int}
_RESOURCES = {"client_cpus": float, "client_gpus": float}
_CLIENT_KEYS: dict[str, type] = {
    "defence": str,
    "lr": float,
    "epochs": int,
    "mini_batch": int,
    "clip": float,
    "noise_multiplier": float,
    "batch_size": int,
    "delta": float,
    "poisson": bool,
}
_CHOICES = {
    "data.source": ("auto", "cifar10", "photos", "breast_cancer"),
    "data.partition": ("iid", "dirichlet"),
    "model.dtype": ("float64", "float32"),
    "defence": tuple(TRAINERS),
    "audit.inversion.dtype": ("float32", "float64"),
}


class ConfigError(ValueError):
    """A scenario key or value that cannot be used; the message says which and what is allowed."""


def _typed(key: str, value: Any, kind: type) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{key} = {value!r}: expected {kind.__name__}")
    return value


def _table(raw: Mapping[str, Any], prefix: str, spec: Mapping[str, type]) -> dict[str, Any]:
    out = {}
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if key not in spec:
            raise ConfigError(f"unknown key {path!r}: allowed are {', '.join(sorted(spec))}")
        out[key] = _typed(path, value, spec[key])
        if path in _CHOICES and out[key] not in _CHOICES[path]:
            raise ConfigError(f"{path} = {value!r}: allowed are {', '.join(_CHOICES[path])}")
    return out


def _spec_of(cls: type, exclude: tuple[str, ...] = ()) -> dict[str, type]:
    """Field name to scalar type of a flat dataclass (annotations are strings here)."""
    kinds = {"str": str, "int": int, "float": float, "bool": bool}
    return {f.name: kinds[str(f.type)] for f in fields(cls) if f.name not in exclude}


def _client_ids(key: str, count: int) -> range:
    """``"3"`` or ``"0-4"`` (inclusive) as client ids, checked against ``count``."""
    try:
        lo, _, hi = key.partition("-")
        ids = range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise ConfigError(
            f"clients.{key}: a client table is named by an id or a range like '0-4'"
        ) from None
    if not ids or ids.start < 0 or ids.stop > count:
        raise ConfigError(
            f"clients.{key}: ids must lie in 0..{count - 1} (clients.count = {count})"
        )
    return ids


def _client(path: str, settings: Mapping[str, Any]) -> ClientSpec:
    train_keys = ("defence", "lr", "epochs", "mini_batch", "clip", "noise_multiplier", "poisson")
    train = {k: settings[k] for k in train_keys if k in settings}
    if train.get("defence") == "fedsgd":
        train.pop("epochs", None)
        train.pop("mini_batch", None)
    try:
        training = LocalTraining(**train)
        spec = ClientSpec(
            training=training,
            **{k: settings[k] for k in ("batch_size", "delta") if k in settings},
        )
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from None
    if spec.batch_size < 1:
        raise ConfigError(f"{path}.batch_size = {spec.batch_size}: must be >= 1")
    if not 0 < spec.delta < 1:
        raise ConfigError(f"{path}.delta = {spec.delta}: must be in (0, 1)")
    return spec


def parse_scenario(raw: Mapping[str, Any]) -> Scenario:
    """Validate a scenario given as nested mappings (as TOML reads it).

    Raises
    ------
    ConfigError
        For an unknown key, a wrong type, a value out of range, or a bad client id.
    """
    allowed = {*_TOP, "resources", "data", "model", "clients", "audit", "cluster", "federation"}
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"unknown key {key!r}: allowed are {', '.join(sorted(allowed))}")
    top = _table({k: v for k, v in raw.items() if k in _TOP}, "", _TOP)
    resources = _resources(raw.get("resources", {}))
    cluster = _cluster(raw.get("cluster", {}))
    federation = _federation(raw.get("federation", {}))
    data = DataSpec(**_table(raw.get("data", {}), "data.", _spec_of(DataSpec)))
    model = ModelSpec(**_table(raw.get("model", {}), "model.", _spec_of(ModelSpec)))
    clients_raw = dict(raw.get("clients", {}))
    count = _typed("clients.count", clients_raw.pop("count", 2), int)
    if count < 1:
        raise ConfigError(f"clients.count = {count}: must be >= 1")
    defaults = _table(
        {k: v for k, v in clients_raw.items() if not isinstance(v, dict)}, "clients.", _CLIENT_KEYS
    )
    per_client = [dict(defaults) for _ in range(count)]
    for key, table in clients_raw.items():
        if isinstance(table, dict):
            for cid in _client_ids(key, count):
                per_client[cid].update(_table(table, f"clients.{key}.", _CLIENT_KEYS))
    specs = tuple(_client(f"clients.{i}", s) for i, s in enumerate(per_client))
    rounds = top.get("rounds", 3)
    if rounds < 1:
        raise ConfigError(f"rounds = {rounds}: must be >= 1")
    audit = _audit(raw.get("audit", {}), rounds, count)
    _check_data(data)
    _check_model(model)
    _check_federation(federation, count)
    for spec in specs:
        if spec.batch_size > data.samples_per_client:
            raise ConfigError(
                f"a client's batch_size = {spec.batch_size} exceeds data.samples_per_client = "
                f"{data.samples_per_client}"
            )
    return Scenario(
        name=top.get("name", "scenario"),
        rounds=rounds,
        seed=top.get("seed", 0),
        data=data,
        model=model,
        clients=specs,
        audit=audit,
        cluster=cluster,
        federation=federation,
        **resources,
    )


def _resources(raw: Mapping[str, Any]) -> dict[str, Any]:
    out = _table(raw, "resources.", _RESOURCES)
    cpus = out.get("client_cpus", Scenario.client_cpus)
    try:
        check_resources(
            "resources.client_cpus",
            cpus,
            "resources.client_gpus",
            out.get("client_gpus", Scenario.client_gpus),
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cpus == 0:
        raise ConfigError(
            "resources.client_cpus = 0.0: must be > 0 (Flower fits node CPUs / client_cpus "
            "clients on each node)"
        )
    return out


def _cluster(raw: Mapping[str, Any]) -> ClusterSpec:
    settings = _table(raw, "cluster.", _spec_of(ClusterSpec))
    try:
        return ClusterSpec(**settings)
    except ValueError as err:
        raise ConfigError(f"cluster.{err}") from None


def _federation(raw: Any) -> FederationSpec:
    """``[federation]``, with pydantic's first complaint as a dotted key, its value and what
    is allowed."""
    try:
        return FederationSpec.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = [str(part) for part in first["loc"] if not str(part).startswith(("int", "float"))]
        key = ".".join(["federation", *where])
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"unknown key {key!r}: {_federation_keys(where[:-1])}") from None
        message = str(first["msg"]).removeprefix("Value error, ")
        if isinstance(first["input"], dict):  # a check across the table's keys
            raise ConfigError(f"{key}: {message}") from None
        raise ConfigError(f"{key} = {first['input']!r}: {message}") from None


def _check_federation(federation: FederationSpec, count: int) -> None:
    """What SecAgg+ needs of the cohort: every client is sampled each round."""
    secagg = federation.secagg
    if secagg is None:
        return
    if count < 2:
        raise ConfigError(
            f"federation.secagg with clients.count = {count}: SecAgg+ sums at least 2 clients"
        )
    threshold = secagg.reconstruction_threshold
    if isinstance(threshold, int) and threshold > count:
        raise ConfigError(
            f"federation.secagg.reconstruction_threshold = {threshold}: at most clients.count "
            f"= {count} (a secret needs that many of its neighbours' shares)"
        )


def _federation_keys(table: list[str]) -> str:
    """What a ``[federation...]`` table allows, in words."""
    model: type[Any] = FederationSpec
    for part in table:
        model = model.model_fields[part].annotation.__args__[0]  # X | None: the model X
    return "allowed are " + ", ".join(sorted(model.model_fields))


_TARGET_LISTS = ("rounds", "clients")
# Audit keys that are not scalars: target lists, the attack list and the per-attack tables.
_AUDIT_NESTED = (*_TARGET_LISTS, "attacks", "spearpp", "inversion")


def _ids(key: str, value: Any, low: int, high: int) -> tuple[int, ...]:
    """A list of ints in [low, high] (``[]``: all)."""
    if not (isinstance(value, list) and all(type(v) is int for v in value)):
        raise ConfigError(f"{key} = {value!r}: expected a list of ints ([] = all)")
    bad = [v for v in value if not low <= v <= high]
    if bad:
        raise ConfigError(f"{key} = {value!r}: {bad} outside {low}..{high}")
    return tuple(value)


def _names(key: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A non-empty list of distinct names out of ``allowed``."""
    if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        raise ConfigError(
            f"{key} = {value!r}: expected a non-empty list out of {', '.join(allowed)}"
        )
    bad = [v for v in value if v not in allowed]
    if bad or len(set(value)) != len(value):
        raise ConfigError(f"{key} = {value!r}: allowed are {', '.join(allowed)}, each at most once")
    return tuple(value)


def _known(prefix: str, raw: Mapping[str, Any], allowed: Iterable[str]) -> None:
    names = sorted(allowed)
    for key in raw:
        if key not in names:
            raise ConfigError(f"unknown key '{prefix}.{key}': allowed are {', '.join(names)}")


def _targets(prefix: str, raw: Mapping[str, Any], rounds: int, count: int) -> dict[str, Any]:
    """The ``rounds`` and ``clients`` lists of a table, checked against the run."""
    limits = {"rounds": (1, rounds), "clients": (0, count - 1)}
    return {k: _ids(f"{prefix}.{k}", raw[k], *limits[k]) for k in _TARGET_LISTS if k in raw}


def _inversion(raw: Any, rounds: int, count: int) -> InversionSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"audit.inversion = {raw!r}: expected a table")
    nested = (*_TARGET_LISTS, "losses")
    _known("audit.inversion", raw, [*_spec_of(InversionSpec, nested), *nested])
    out = _table(
        {k: v for k, v in raw.items() if k not in nested},
        "audit.inversion.",
        _spec_of(InversionSpec, nested),
    )
    out |= _targets("audit.inversion", raw, rounds, count)
    if "losses" in raw:
        out["losses"] = _names("audit.inversion.losses", raw["losses"], LOSSES)
    spec = InversionSpec(**out)
    for key in ("restarts", "iterations"):
        if getattr(spec, key) < 1:
            raise ConfigError(f"audit.inversion.{key} = {getattr(spec, key)}: must be >= 1")
    if not spec.lr > 0:
        raise ConfigError(f"audit.inversion.lr = {spec.lr}: must be > 0")
    if not spec.tv >= 0:
        raise ConfigError(f"audit.inversion.tv = {spec.tv}: must be >= 0")
    try:
        InversionConfig(device=spec.device)
    except ValueError:
        raise ConfigError(
            f"audit.inversion.device = {spec.device!r}: allowed are auto, cpu, cuda, cuda:N"
        ) from None
    return spec


def _audit(raw: Mapping[str, Any], rounds: int, count: int) -> AuditSpec:
    _known("audit", raw, [*_spec_of(AuditSpec, _AUDIT_NESTED), *_AUDIT_NESTED])
    scalars = {k: v for k, v in raw.items() if k not in _AUDIT_NESTED}
    out = _table(scalars, "audit.", _spec_of(AuditSpec, _AUDIT_NESTED))
    out |= _targets("audit", raw, rounds, count)
    if "attacks" in raw:
        out["attacks"] = _names("audit.attacks", raw["attacks"], tuple(sorted(ATTACKS)))
    if "spearpp" in raw:
        table = raw["spearpp"]
        if not isinstance(table, dict) or set(table) - set(_TARGET_LISTS):
            raise ConfigError(
                f"audit.spearpp = {table!r}: a table of {', '.join(_TARGET_LISTS)} (SPEAR++'s "
                "budget keys starts, steps, ... stay in [audit])"
            )
        out["spearpp"] = AttackTargets(**_targets("audit.spearpp", table, rounds, count))
    if "inversion" in raw:
        out["inversion"] = _inversion(raw["inversion"], rounds, count)
    spec = AuditSpec(**out)
    for key in ("starts", "steps", "max_passes", "workers", "proxy_max_iter"):
        if getattr(spec, key) < 1:
            raise ConfigError(f"audit.{key} = {getattr(spec, key)}: must be >= 1")
    for key in ("time_budget_s", "wait_s", "proxy_tol"):
        if getattr(spec, key) <= 0:
            raise ConfigError(f"audit.{key} = {getattr(spec, key)}: must be > 0")
    return spec


def _check_data(data: DataSpec) -> None:
    if data.samples_per_client < 1:
        raise ConfigError(f"data.samples_per_client = {data.samples_per_client}: must be >= 1")
    if data.test_size < 1:
        raise ConfigError(f"data.test_size = {data.test_size}: must be >= 1")
    if data.alpha <= 0:
        raise ConfigError(f"data.alpha = {data.alpha}: must be > 0")


def _check_model(model: ModelSpec) -> None:
    if model.width < 1:
        raise ConfigError(f"model.width = {model.width}: must be >= 1")
    if model.depth < 2:
        raise ConfigError(f"model.depth = {model.depth}: must be >= 2")


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string: --set clients.3.defence=dp


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` overrides on dotted keys (``clients.3.defence=dp``), values read as TOML."""
    out: dict[str, Any] = copy.deepcopy(dict(raw))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. clients.3.defence=dp")
        node = out
        *parents, leaf = key.strip().split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is a value, not a table")
            node = child
        node[leaf] = _parse_value(text.strip())
    return out


def load_scenario(path: Path, overrides: Iterable[str] = ()) -> tuple[Scenario, dict[str, Any]]:
    """Read, override and validate a scenario file; returns it and the resolved raw mapping."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"scenario file {path} does not exist") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None
    resolved = apply_overrides(raw, overrides)
    return parse_scenario(resolved), resolved
