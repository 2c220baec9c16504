"""The registered server behaviours, one module each, found here by name: a module of this
package that registers a behaviour (:func:`~strategies.behaviours.base.register`) is all a new
behaviour takes."""

from __future__ import annotations

import sys

from strategies.behaviours.base import (
    BEHAVIOUR,
    BEHAVIOURS,
    BehaviourSettings,
    ServerBehaviour,
    behaviour_settings,
)

BEHAVIOURS.discover(sys.modules[__name__])

__all__ = ["BEHAVIOUR", "BEHAVIOURS", "BehaviourSettings", "ServerBehaviour", "behaviour_settings"]
