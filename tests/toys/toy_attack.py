"""A toy attack, as a user adds one: this module and its table (``[audit.toy]``), nothing else.

It reads one sample off the neuron with the largest bias gradient, x = dL/dW_j / dL/db_j,
scaled by its table's ``scale`` (1: the analytic rule's reading of that neuron)."""

from __future__ import annotations

import numpy as np
import torch

from attacks import AttackPlugin, AttackTable, Reconstruction, ServerView
from attacks.plugin import register
from flsim_plugins.settings import Real


class ToyTable(AttackTable):
    scale: Real = 1.0


@register
class ToyAttack(AttackPlugin):
    name = "toy"
    Config = float
    Table = ToyTable

    def config(self, table: ToyTable, variant: str | None, seed: int) -> float:
        return table.scale

    def run(self, view: ServerView, config: float) -> Reconstruction:
        w_key, b_key = view.first_layer
        grad_w, grad_b = view.gradient[w_key], view.gradient[b_key]
        j = int(np.argmax(np.abs(grad_b)))
        x = torch.from_numpy(config * grad_w[j] / grad_b[j]).double()[None]
        return Reconstruction(
            inputs=x,
            batch_size=1,
            batch_size_method="toy",
            status="partial",
            confidence=torch.zeros(1, dtype=torch.float64),
            verified=torch.zeros(1, dtype=torch.bool),
            certified=torch.zeros(1, dtype=torch.bool),
            settings={"scale": config},
        )
