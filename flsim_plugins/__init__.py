"""What every plugin of fl-sim is built on: the :class:`Registry` that names it and the
:class:`Settings` its config table validates into. Imports nothing of the rest of fl-sim."""

from flsim_plugins.registry import Registry
from flsim_plugins.settings import Bool, Int, Real, Settings, Str, ValidationError, explain

__all__ = ["Bool", "Int", "Real", "Registry", "Settings", "Str", "ValidationError", "explain"]
