"""Errors raised by the attacks."""


class AttackInputError(ValueError):
    """The inputs handed to an attack cannot be attacked as given.

    The message names the offending input and what is allowed instead.
    """


class NotLowRankError(AttackInputError):
    """The gradient is not low-rank: its estimated batch size is not below min(m, n).

    Attributes
    ----------
    batch_size_estimated
        The estimate, for records that keep it beside the refusal.
    """

    def __init__(self, message: str, batch_size_estimated: int) -> None:
        super().__init__(message)
        self.batch_size_estimated = batch_size_estimated
