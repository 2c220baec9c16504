"""The world's clients: their defences (:mod:`clients.defences`, a registry of training
procedures and update mods) and what local training shares (:mod:`clients.training`)."""

from clients.defences import TrainingSettings, train_locally, training_settings
from clients.privacy import PrivacyLedger
from clients.training import DivergenceError, TrainResult

__all__ = [
    "DivergenceError",
    "PrivacyLedger",
    "TrainResult",
    "TrainingSettings",
    "train_locally",
    "training_settings",
]
