"""The world's clients: local training procedures, registered by defence name."""

from clients.training import TRAINERS, LocalTraining, TrainResult, train_locally

__all__ = ["TRAINERS", "LocalTraining", "TrainResult", "train_locally"]
