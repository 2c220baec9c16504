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

    def __init__(
        self, batch_size_estimated: int, method: str, m: int, n: int, silent: int = 0
    ) -> None:
        neurons = f"m={m}" if not silent else f"m={m} neurons with a gradient, {silent} silent"
        super().__init__(
            f"estimated batch size B_hat={batch_size_estimated} ({method}) is not below "
            f"min(m, n) = {min(m, n)} ({neurons}, n={n}): the gradient is not low-rank, so "
            "SPEAR++ cannot separate the batch"
        )
        self.batch_size_estimated = batch_size_estimated
        self.method, self.m, self.n = method, m, n
