"""Errors raised by the attacks."""


class AttackInputError(ValueError):
    """The inputs handed to an attack cannot be attacked as given.

    The message names the offending input and what is allowed instead.
    """
