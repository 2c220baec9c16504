"""The server's side under Flower's Message API: the wrapper strategies (honest but curious,
tampering with what it sends, fault tolerant) over the Flower-free :mod:`strategies.core`, and
what they derive from replies. Flower's legacy API, which SecAgg+ needs, is
:mod:`strategies.legacy`."""

from strategies.core import InterceptedAggregate
from strategies.fault_tolerant import FaultSink, FaultTolerant
from strategies.gradients import update_as_gradient
from strategies.honest_curious import HonestButCurious, UpdateSink
from strategies.interception import InterceptedUpdate, intercept
from strategies.round_offset import RoundOffset
from strategies.screening import LeftOut, screen
from strategies.tampering import Tampering

__all__ = [
    "FaultSink",
    "FaultTolerant",
    "HonestButCurious",
    "InterceptedAggregate",
    "InterceptedUpdate",
    "LeftOut",
    "RoundOffset",
    "Tampering",
    "UpdateSink",
    "intercept",
    "screen",
    "update_as_gradient",
]
