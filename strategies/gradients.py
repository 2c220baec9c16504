"""Turning a client's reply into the gradient the attack works on."""

from __future__ import annotations

import torch


def update_as_gradient(sent: torch.Tensor, received: torch.Tensor, lr: float) -> torch.Tensor:
    """The update as a gradient: (sent - received) / lr.

    For one SGD step (FedSGD) this is the batch gradient exactly; for several local steps
    (FedAvg, DP-SGD) it is the sum of the steps' gradients, which keeps the rank-B structure the
    attack needs.
    """
    if not lr > 0:
        raise ValueError(f"lr={lr!r}: the server's learning rate must be > 0")
    return (sent - received) / lr
