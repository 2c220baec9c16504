"""What an attack is to the audit: a plugin with its own ``[audit.<name>]`` table.

An attack registers itself (:data:`register`) in its module under :mod:`attacks.plugins`; the
audit reads everything it needs from the plugin (its table, variants, settings, whether it needs
the whole model or may run where there is no ground truth), never from the attack's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from attacks.errors import AttackInputError
from attacks.result import Reconstruction
from attacks.view import ServerView
from flsim_plugins import Registry
from flsim_plugins.settings import Ids, Settings


class AttackTable(Settings):
    """An attack's table, ``[audit.<name>]``: its targets within the audit's (empty: every
    audited round and client), and whatever settings the attack adds.

    An attack runs on a client's update of a round when the audit targets it (``audit.rounds``,
    ``audit.clients``) and so does the attack's own table.
    """

    rounds: Ids = ()
    clients: Ids = ()

    def covers(self, server_round: int, client: int) -> bool:
        """Whether (round, client) is in these targets."""
        return (not self.rounds or server_round in self.rounds) and (
            not self.clients or client in self.clients
        )


class AttackPlugin(ABC):
    """One attack as the audit runs it.

    Attributes
    ----------
    name
        Its registry name and table name.
    Table
        Its ``[audit.<name>]`` table.
    Config
        The type of its settings for one run (what :meth:`config` makes).
    whole_model
        Needs every array of the update and the architecture (else the first layer suffices).
    runs_without_truth
        What it reports stands without ground truth (its certificate), so it may audit where
        no judge holds the data (a user's own Flower app).
    """

    name: ClassVar[str]
    Table: ClassVar[type[AttackTable]] = AttackTable
    Config: ClassVar[type]
    whole_model: ClassVar[bool] = False
    runs_without_truth: ClassVar[bool] = False

    def variants(self, table: Any) -> tuple[str, ...]:
        """Its runs per update, each labelled ``NAME-VARIANT`` (``()``: one run, ``NAME``)."""
        return ()

    @abstractmethod
    def config(self, table: Any, variant: str | None, seed: int) -> Any:
        """The settings of one run (picklable: it travels to the attack's worker)."""

    @abstractmethod
    def run(self, view: ServerView, config: Any) -> Reconstruction:
        """Attack one update."""

    def peak_bytes(self, view: ServerView, config: Any) -> int:
        """Estimated memory of one run on ``view`` (its arrays present) above an idle
        worker's, at its peak, so the audit can start it only where it fits. By default four
        times the arrays it is given (read, widened, worked on); an attack that knows better
        says so."""
        arrays = [*view.weights.values(), *view.gradient.values()]
        return 4 * sum(int(np.asarray(a).nbytes) for a in arrays)

    def reconstruct(self, view: ServerView, config: Any) -> Reconstruction:
        """:meth:`run`, once ``config`` is checked to be this attack's.

        Raises
        ------
        AttackInputError
            For settings of another type, or inputs the attack refuses.
        """
        if not isinstance(config, self.Config):
            raise AttackInputError(
                f"attack {self.name!r} takes a {self.Config.__name__}, got {type(config).__name__}"
            )
        return self.run(view, config)


ATTACKS: Registry[AttackPlugin] = Registry("attack", key="audit.attacks")
# Class decorator: one instance of the plugin class, registered under its name.
register = ATTACKS.instance


def run_attack(name: str, view: ServerView, config: Any) -> Reconstruction:
    """Run the attack registered as ``name`` on ``view``.

    Raises
    ------
    AttackInputError
        For an unknown name, settings of another attack, or inputs the attack refuses.
    """
    if name not in ATTACKS:
        raise AttackInputError(f"attack {name!r}: allowed are {', '.join(sorted(ATTACKS))}")
    return ATTACKS[name].reconstruct(view, config)
