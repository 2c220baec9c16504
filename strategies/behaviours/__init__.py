"""The registered server behaviours, one module each, found here by name: a module of this
package that registers a behaviour (:func:`~strategies.behaviours.base.register`) is all a new
behaviour takes."""

from __future__ import annotations

import importlib
import pkgutil

from strategies.behaviours.base import (
    BEHAVIOUR,
    BEHAVIOURS,
    BehaviourSettings,
    ServerBehaviour,
    behaviour_settings,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["BEHAVIOUR", "BEHAVIOURS", "BehaviourSettings", "ServerBehaviour", "behaviour_settings"]
