"""The world's clients: local training procedures, registered by defence name."""

from clients.privacy import PrivacyLedger
from clients.training import (
    TRAINERS,
    DivergenceError,
    LocalTraining,
    TrainResult,
    train_locally,
)

__all__ = [
    "TRAINERS",
    "DivergenceError",
    "LocalTraining",
    "PrivacyLedger",
    "TrainResult",
    "train_locally",
]
