"""The honest-but-curious server's side: what it derives from a client's reply."""

from strategies.gradients import update_as_gradient

__all__ = ["update_as_gradient"]
