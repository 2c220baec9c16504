"""The server's ideas free of Flower's API: what each client is sent, what a sum of updates was
taken at, how the global model is kept honest. Flower's two server APIs (the Message API's
strategies, the legacy one SecAgg+ drives) are thin adapters over it."""

from strategies.core.aggregate import InterceptedAggregate
from strategies.core.partitions import Partitions
from strategies.core.server import (
    SentSum,
    ServerCore,
    never_fires,
    same_layer,
    single_trained_layer,
)

__all__ = [
    "InterceptedAggregate",
    "Partitions",
    "SentSum",
    "ServerCore",
    "never_fires",
    "same_layer",
    "single_trained_layer",
]
