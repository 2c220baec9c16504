"""Settings declared once, as frozen pydantic models, and their validation errors in one line
that names the dotted key, the value and what is allowed.

Every defence's settings and every table of a scenario are such models; :func:`explain` turns
pydantic's ``ValidationError`` into the message both the scenario loader and direct callers
raise.
"""

from __future__ import annotations

import contextlib
import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)
from pydantic import ValidationError as ValidationError
from pydantic_core import ErrorDetails

__all__ = [
    "AtLeastOne",
    "Bool",
    "Ids",
    "Int",
    "Names",
    "Positive",
    "Real",
    "Settings",
    "Str",
    "ValidationError",
    "distinct",
    "explain",
]


def _widen(value: Any) -> Any:
    """An int where a float is expected is that float (TOML writes ``clip = 2``); a bool is not."""
    return float(value) if type(value) is int else value


# Strict scalars: TOML's types are kept (1 is not a bool, 1.5 not an int, "2" not a number),
# but an int is a float's value.
Real = Annotated[float, BeforeValidator(_widen)]
Int = StrictInt
Bool = StrictBool
Str = StrictStr
# Lists read from TOML (lists, not tuples): of ids, each an int, and of names.
Ids = Annotated[tuple[Int, ...], Field(strict=False)]
Names = Annotated[tuple[Str, ...], Field(strict=False)]
Positive = Annotated[Real, Field(gt=0)]
AtLeastOne = Annotated[Int, Field(ge=1)]


class Settings(BaseModel):
    """Base of every settings model: immutable, unknown keys rejected, scalars of TOML's types."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def __setattr__(self, name: str, value: Any) -> None:
        # As a frozen dataclass does: an AttributeError, not a validation error.
        raise AttributeError(f"{type(self).__name__} is immutable: {name!r} cannot be set")


def distinct(value: tuple[str, ...], allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A non-empty list of distinct names out of ``allowed`` (a field validator's check)."""
    if not value or set(value) - set(allowed) or len(set(value)) != len(value):
        raise ValueError(f"allowed are {', '.join(allowed)}, each at most once (at least one)")
    return value


# What each kind of failure says after "key = value: ".
_TYPES = {"int_type": "int", "float_type": "float", "bool_type": "bool", "string_type": "str"}
_BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def _allowed(expected: str) -> str:
    """pydantic's "'a', 'b' or 'c'" as "a, b, c"."""
    return re.sub(r"'([^']*)'", r"\1", expected).replace(" or ", ", ")


def _field(model: type[BaseModel], loc: tuple[int | str, ...]) -> Any:
    """The annotation of the field at ``loc`` inside ``model`` (``None`` past a non-model)."""
    annotation: Any = model
    for part in loc:
        tables = _keys(annotation)
        if part not in tables:
            return None
        annotation = tables[part]
    return annotation


def _keys(table: Any) -> dict[str | int, Any]:
    """What each key of ``table`` holds: its fields' annotations, and the plugins' tables of a
    :class:`~flsim_plugins.tables.PluginTables`."""
    fields = getattr(table, "model_fields", None)
    if not isinstance(fields, dict):
        return {}
    keys: dict[str | int, Any] = {k: _table_model(f.annotation) for k, f in fields.items()}
    plugin_tables = getattr(table, "plugin_tables", None)
    if plugin_tables is not None:
        with contextlib.suppress(NotImplementedError):  # the base class names no plugins
            keys.update(plugin_tables())
    return keys


def _table_model(annotation: Any) -> Any:
    """The model an optional table's annotation (``X | None``) holds; else ``annotation``."""
    models = [a for a in getattr(annotation, "__args__", ()) if hasattr(a, "model_fields")]
    return models[0] if models else annotation


def _why(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx", {})
    if kind in _TYPES:
        return f"expected {_TYPES[kind]}"
    if kind in _BOUNDS:
        bound = next(v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le"))
        return f"must be {_BOUNDS[kind]} {bound}"
    if kind == "literal_error":
        return f"allowed are {_allowed(str(ctx['expected']))}"
    if kind in ("tuple_type", "list_type"):
        return "expected a list"
    return str(error["msg"]).removeprefix("Value error, ")


def explain(
    err: ValidationError, model: type[BaseModel], prefix: str = "", sep: str = " = "
) -> str:
    """One line per failure: ``prefix.key = value: why`` (``why`` names what is allowed).

    Parameters
    ----------
    err
        pydantic's error.
    model
        The model that was validated (its fields list what an unknown key could have been).
    prefix
        Dotted path of the table that was validated (``clients.2.``), prepended to each key.
    sep
        Between key and value: ``" = "`` as in TOML, ``"="`` as in a call's keywords.
    """
    lines = []
    for error in err.errors():
        loc = error["loc"]
        key = prefix + ".".join(str(part) for part in loc)
        value = error["input"]
        if _field(model, loc) is float and type(value) is int:
            value = float(value)  # as the field holds it
        if error["type"] == "extra_forbidden":
            names = sorted(map(str, _keys(_field(model, loc[:-1]))))
            lines.append(f"unknown key {key!r}: allowed are {', '.join(names)}")
        elif not loc:  # a check of the whole table: its message names the keys
            lines.append(f"{prefix.rstrip('.') + ': ' if prefix else ''}{_why(error)}")
        else:
            lines.append(f"{key}{sep}{value!r}: {_why(error)}")
    return "; ".join(lines)
