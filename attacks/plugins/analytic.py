"""The analytic attack in the audit: the samples single neurons isolate, ``[audit.analytic]``
(its targets only: the rule is cheap enough to run wherever SPEAR++ may)."""

from __future__ import annotations

import torch

from attacks.analytic import AnalyticConfig, run_analytic
from attacks.plugin import AttackPlugin, AttackTable, register
from attacks.result import Reconstruction
from attacks.view import ServerView, first_layer


@register
class Analytic(AttackPlugin):
    """x_i = dL/dW_j / dL/db_j for each neuron only one sample fires."""

    name = "analytic"
    Config = AnalyticConfig

    def config(self, table: AttackTable, variant: str | None, seed: int) -> AnalyticConfig:
        return AnalyticConfig(seed=seed)

    def run(self, view: ServerView, config: AnalyticConfig) -> Reconstruction:
        return run_analytic(first_layer(view, torch.device("cpu")), config)
