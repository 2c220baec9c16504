"""The honest-but-curious server's side: the wrapper strategy and what it derives from replies."""

from strategies.gradients import update_as_gradient
from strategies.honest_curious import HonestButCurious, UpdateSink
from strategies.interception import InterceptedUpdate, intercept

__all__ = ["HonestButCurious", "InterceptedUpdate", "UpdateSink", "intercept", "update_as_gradient"]
