"""Reading scenarios: TOML, dotted ``--set`` overrides, and validation with errors that name the
key, the value and what is allowed."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from clients.defences import training_defences, update_mods
from fl_sim.config.schema import ClientSpec, Scenario, ServerSpec
from flsim_plugins.settings import ValidationError, explain
from strategies.behaviours import BEHAVIOUR, BEHAVIOURS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Keys of [clients] and its client tables that are not a defence's: how many clients (only in
# [clients]) and what ClientSpec holds beside the defences.
_COUNT = "count"
_CLIENT_OWN = ("batch_size",)
# The key naming a client's training defence; an update mod is toggled by its own sub-table.
_DEFENCE = "defence"


class ConfigError(ValueError):
    """A scenario key or value that cannot be used; the message says which and what is allowed."""


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], raw: Any, prefix: str = "") -> M:
    """``raw`` validated as ``model``; pydantic's errors as one ConfigError naming the keys."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(explain(err, model, prefix)) from None


def _client_keys() -> tuple[list[str], list[str]]:
    """The flat keys of a client table (its own, the training defences' settings) and the
    update mods' sub-table names, as the registry declares them."""
    flat = {_DEFENCE, *_CLIENT_OWN}
    for defence in training_defences().values():
        flat |= set(defence.Settings.model_fields)
    return sorted(flat), list(update_mods())


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


def _check_keys(path: str, table: Mapping[str, Any]) -> None:
    """Every key of a client table is a client's, a training defence's or an update mod's."""
    flat, mods = _client_keys()
    for key, value in table.items():
        if key in mods:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}.{key} = {value!r}: expected a table of its settings")
        elif key not in flat:
            allowed = ", ".join([*flat, *(f"[{m}]" for m in mods)])
            raise ConfigError(f"unknown key '{path}.{key}': allowed are {allowed}")


def _client(path: str, settings: Mapping[str, Any]) -> ClientSpec:
    """One client from its merged table: the training defence takes the keys its settings
    declare (a group's keys for another defence are not its), each named mod its sub-table."""
    known = training_defences()
    name = settings.get(_DEFENCE, "fedsgd")
    if not isinstance(name, str) or name not in known:
        raise ConfigError(f"{path}.{_DEFENCE} = {name!r}: allowed are {', '.join(known)}")
    cls = known[name].Settings
    training = _validated(
        cls, {k: v for k, v in settings.items() if k in cls.model_fields}, f"{path}."
    )
    mods = tuple(
        _validated(mod.Settings, settings[key], f"{path}.{key}.")
        for key, mod in update_mods().items()
        if key in settings
    )
    own = {k: settings[k] for k in _CLIENT_OWN if k in settings}
    return _validated(ClientSpec, {"training": training, "mods": mods, **own}, f"{path}.")


def _clients(raw: Any) -> tuple[ClientSpec, ...]:
    """``[clients]``: ``count``, defaults for every client, and tables per client or range
    whose keys override the defaults (an update mod's sub-table replaces the default's)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"clients = {raw!r}: expected a table")
    count = raw.get(_COUNT, 2)
    if type(count) is not int or count < 1:
        raise ConfigError(f"clients.{_COUNT} = {count!r}: must be an int >= 1")
    _, mods = _client_keys()
    defaults = {
        k: v for k, v in raw.items() if k != _COUNT and (k in mods or not isinstance(v, dict))
    }
    _check_keys("clients", defaults)
    per_client = [dict(defaults) for _ in range(count)]
    for key, table in raw.items():
        if isinstance(table, dict) and key not in mods:
            _check_keys(f"clients.{key}", table)
            for cid in _client_ids(key, count):
                per_client[cid].update(table)
    return tuple(_client(f"clients.{i}", s) for i, s in enumerate(per_client))


def _server(raw: Any) -> ServerSpec:
    """``[server]``: ``behaviour`` names the behaviour (``honest`` by default); a sub-table
    per behaviour holds its settings: each is validated, the named one's are used (so that
    ``--set server.behaviour=...`` switches between the tables a file keeps)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"server = {raw!r}: expected a table")
    name = raw.get(BEHAVIOUR, "honest")
    if not isinstance(name, str) or name not in BEHAVIOURS:
        raise ConfigError(f"server.{BEHAVIOUR} = {name!r}: allowed are {', '.join(BEHAVIOURS)}")
    for key, value in raw.items():
        if key != BEHAVIOUR and key not in BEHAVIOURS:
            allowed = ", ".join([BEHAVIOUR, *(f"[{b}]" for b in BEHAVIOURS)])
            raise ConfigError(f"unknown key 'server.{key}': allowed are {allowed}")
        if key in BEHAVIOURS and not isinstance(value, dict):
            raise ConfigError(f"server.{key} = {value!r}: expected a table of its settings")
    tables = {
        key: _validated(BEHAVIOURS[key].Settings, raw.get(key, {}), f"server.{key}.")
        for key in BEHAVIOURS
        if key in raw or key == name
    }
    return ServerSpec(behaviour=tables[name])


def parse_scenario(raw: Mapping[str, Any]) -> Scenario:
    """Validate a scenario given as nested mappings (as TOML reads it).

    Raises
    ------
    ConfigError
        For an unknown key, a wrong type, a value out of range, a bad client id or an unknown
        server behaviour.
    """
    tables = dict(raw)
    tables["clients"] = _clients(tables.get("clients", {}))
    tables["server"] = _server(tables.get("server", {}))
    return _validated(Scenario, tables)


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
