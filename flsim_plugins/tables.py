"""A settings table whose sub-tables belong to plugins: ``[audit.spearpp]``, ``[audit.inversion]``.

The table declares its own keys as any :class:`~flsim_plugins.settings.Settings` does; every
registered plugin adds a sub-table named after it, validated by the plugin's own model, so a new
plugin brings its table without the table's class changing. Keys that moved into a plugin's
table are refused with a message naming where they went.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    SerializeAsAny,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails

from flsim_plugins.settings import Settings


class PluginTables(Settings):
    """Settings with one sub-table per registered plugin (see the module's docstring).

    Subclasses name the plugins' tables in :meth:`plugin_tables` and the keys that moved in
    :attr:`moved` (``{"starts": "[audit.spearpp] starts"}``), refused naming where they went.
    """

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)
    __pydantic_extra__: dict[str, SerializeAsAny[BaseModel]] = Field(init=False)

    moved: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def plugin_tables(cls) -> Mapping[str, type[BaseModel]]:
        """Each registered plugin's name and the model of its table."""
        raise NotImplementedError

    def table(self, plugin: str) -> BaseModel:
        """The table of ``plugin`` (its defaults where the config has none, as in settings made
        before the plugin registered)."""
        found = self.__pydantic_extra__.get(plugin)
        return found if found is not None else self.plugin_tables()[plugin]()

    @model_validator(mode="wrap")
    @classmethod
    def _plugin_tables(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        if not isinstance(data, Mapping):
            return handler(data)
        errors: list[InitErrorDetails] = []
        tables: dict[str, BaseModel] = {}
        for name, model in cls.plugin_tables().items():
            raw = data.get(name, {})
            if isinstance(raw, model):
                tables[name] = raw
                continue
            try:
                tables[name] = model.model_validate(raw)
            except ValidationError as err:
                errors += _within(name, err)
        own = {k: v for k, v in data.items() if k not in cls.plugin_tables()}
        for key in sorted(set(own) - set(cls.model_fields)):
            if key in cls.moved:
                error = ValueError(f"moved to {cls.moved[key]}")
                errors.append(
                    {
                        "type": "value_error",
                        "loc": (key,),
                        "input": own[key],
                        "ctx": {"error": error},
                    }
                )
            else:
                errors.append({"type": "extra_forbidden", "loc": (key,), "input": own[key]})
            del own[key]
        try:
            validated = handler({**own, **tables})
        except ValidationError as err:
            errors += _within(None, err)
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return validated


def _within(table: str | None, err: ValidationError) -> list[InitErrorDetails]:
    """``err``'s failures as failures of the enclosing table, under ``table``'s key."""
    prefix = (table,) if table is not None else ()
    nested: list[InitErrorDetails] = []
    for e in err.errors():
        detail: InitErrorDetails = {
            "type": e["type"],
            "loc": (*prefix, *e["loc"]),
            "input": e["input"],
        }
        if "ctx" in e:
            detail["ctx"] = e["ctx"]
        nested.append(detail)
    return nested
