"""The server's side: the wrapper strategies (honest but curious, tampering with what it
sends, fault tolerant) and what they derive from replies."""

from strategies.aggregate_curious import AggregateCurious, AggregateSink
from strategies.fault_tolerant import FaultSink, FaultTolerant
from strategies.gradients import update_as_gradient
from strategies.honest_curious import HonestButCurious, UpdateSink
from strategies.intercepted_aggregate import InterceptedAggregate
from strategies.interception import InterceptedUpdate, intercept
from strategies.legacy_tampering import LegacyTampering
from strategies.screening import LeftOut, screen
from strategies.tampering import Tampering

__all__ = [
    "AggregateCurious",
    "AggregateSink",
    "FaultSink",
    "FaultTolerant",
    "HonestButCurious",
    "InterceptedAggregate",
    "InterceptedUpdate",
    "LeftOut",
    "LegacyTampering",
    "Tampering",
    "UpdateSink",
    "intercept",
    "screen",
    "update_as_gradient",
]
