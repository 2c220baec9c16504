"""SPEAR++ in the audit: exact reconstruction from the first layer, ``[audit.spearpp]``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from attacks.plugin import AttackPlugin, AttackTable, register
from attacks.result import Reconstruction
from attacks.spearpp import SpearConfig, run_spearpp
from attacks.spearpp.inputs import resolve_device
from attacks.spearpp.memory import peak_bytes
from attacks.view import ServerView, first_layer
from flsim_plugins.settings import AtLeastOne, Real


class SpearTable(AttackTable):
    """``[audit.spearpp]``: SPEAR++'s targets and budget per reconstruction.

    Parameters
    ----------
    starts, steps, max_passes
        Random starts and optimiser steps per pass, passes at most.
    time_budget_s
        Seconds per reconstruction (it stops new passes).
    budget_clock
        What the time budget counts: ``cpu`` (the attack's own CPU seconds per torch thread,
        so attacks running beside the federation, or a busy machine, do not cut it short) or
        ``wall`` seconds.
    """

    starts: AtLeastOne = 2000
    steps: AtLeastOne = 1000
    max_passes: AtLeastOne = 4
    time_budget_s: Annotated[Real, Field(gt=0)] = 30.0
    budget_clock: Literal["cpu", "wall"] = "cpu"


@register
class SpearPP(AttackPlugin):
    """Exact reconstruction of the batch from the first linear layer's gradient, certified
    without ground truth."""

    name = "spearpp"
    Config = SpearConfig
    Table = SpearTable
    runs_without_truth = True

    def config(self, table: SpearTable, variant: str | None, seed: int) -> SpearConfig:
        return SpearConfig(
            starts=table.starts,
            steps=table.steps,
            max_passes=table.max_passes,
            time_budget_s=table.time_budget_s,
            budget_clock=table.budget_clock,
            seed=seed,
        )

    def run(self, view: ServerView, config: SpearConfig) -> Reconstruction:
        obs = first_layer(view, resolve_device(config.device))
        return run_spearpp(obs, batch_size=view.batch_size, noise_std=view.noise_std, config=config)

    def peak_bytes(self, view: ServerView, config: SpearConfig) -> int:
        width, inputs = view.gradient[view.first_layer[0]].shape
        return peak_bytes(width, inputs, view.batch_size, config.max_elements)
