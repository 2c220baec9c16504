"""Turning a client's reply into the gradient the attack works on."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

Array = TypeVar("Array", torch.Tensor, np.ndarray)


def update_as_gradient(sent: Array, received: Array, lr: float) -> Array:
    """The update as a gradient: (sent - received) / lr.

    For one SGD step (FedSGD) this is the batch gradient exactly; for several local steps
    (FedAvg, DP-SGD) it is the sum of the steps' gradients, which keeps the rank-B structure the
    attack needs. A wrong lr scales weight and bias gradients alike, which SPEAR++'s
    reconstruction does not depend on.
    """
    if not lr > 0:
        raise ValueError(f"lr={lr!r}: the learning rate must be > 0")
    gradient: Array = (sent - received) / lr
    return gradient
