"""Flower's legacy server API, for SecAgg+ alone (Flower's ``SecAggPlusWorkflow`` drives a
legacy ``flwr.server.strategy`` strategy): thin adapters over :mod:`strategies.core`, and the
client mod that carries a Message-API ClientApp's reply through it. The day Flower's Message
API carries SecAgg+, this package goes."""

from strategies.legacy.curious import AggregateCurious, AggregateSink
from strategies.legacy.fit_mod import legacy_fit_mod
from strategies.legacy.tampering import LegacyTampering
from strategies.legacy.wrapper import LegacyWrapper

__all__ = [
    "AggregateCurious",
    "AggregateSink",
    "LegacyTampering",
    "LegacyWrapper",
    "legacy_fit_mod",
]
