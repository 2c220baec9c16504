"""One registry type for every kind of plugin: defences, server behaviours, attacks, executors.

A plugin registers itself in the module that implements it (as Opacus' accountants do); the
package holding a kind imports each of its modules once (:meth:`Registry.discover`), so a new
plugin is one module, its tests and its config table.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Generic, Protocol, TypeVar, cast

T = TypeVar("T")
P = TypeVar("P")


class Named(Protocol):
    """A plugin that knows its own name (a defence, a behaviour: its settings' name)."""

    @property
    def name(self) -> str:
        """The name it is registered and configured under."""


C = TypeVar("C", bound=type[Named])


class Registry(Mapping[str, T], Generic[T]):
    """Plugins of one kind, by name, in the order they registered.

    Parameters
    ----------
    kind
        What the plugins are, for messages (``"defence"``, ``"server behaviour"``).
    key
        The setting that names one (``"defence"``, ``"behaviour"``), for :meth:`lookup`'s
        message.
    """

    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        self._plugins: dict[str, T] = {}

    def add(self, name: str, plugin: T) -> T:
        """Register ``plugin`` as ``name``.

        Raises
        ------
        ValueError
            When ``name`` is taken.
        """
        if name in self._plugins:
            raise ValueError(f"a {self.kind} named {name!r} is registered already")
        self._plugins[name] = plugin
        return plugin

    def register(self, name: str) -> Callable[[P], P]:
        """Decorator: register what it decorates (a class, a factory) as ``name``; it stays
        what it was for the type checker (a class used as a ``T`` factory stays a class)."""

        def add(plugin: P) -> P:
            self.add(name, cast(T, plugin))
            return plugin

        return add

    def instance(self, cls: C) -> C:
        """Class decorator: register one instance of the class, under its own name."""
        plugin = cls()
        self.add(plugin.name, cast(T, plugin))
        return cls

    def lookup(self, name: str) -> T:
        """The plugin ``name``.

        Raises
        ------
        ValueError
            For a name nothing registered, naming the setting and what is allowed
            (``behaviour='x': allowed are honest, isolate``).
        """
        if name not in self._plugins:
            raise ValueError(f"{self.key}={name!r}: allowed are {', '.join(self.names())}")
        return self._plugins[name]

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._plugins)

    @staticmethod
    def discover(package: ModuleType) -> None:
        """Import every module of ``package``, whose modules register themselves on import."""
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")

    def __getitem__(self, name: str) -> T:
        return self._plugins[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._plugins)

    def __len__(self) -> int:
        return len(self._plugins)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._plugins)})"
