"""Attacking an update saved anywhere: ``fl-sim attack UPDATE.npz``.

:func:`read_update` checks the file into a :class:`SavedUpdate`; :func:`attack_update` runs
SPEAR++ on it and writes the reconstruction, what the attack vouches for and what it inferred.
No ground truth enters: the result is what the attack itself can say.
"""

from fl_sim.saved_update.attack import attack_update
from fl_sim.saved_update.update_file import KEYS, SavedUpdate, UpdateFileError, read_update

__all__ = ["KEYS", "SavedUpdate", "UpdateFileError", "attack_update", "read_update"]
