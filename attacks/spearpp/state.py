"""``SpearState``: what the stages of one SPEAR++ attack share, from the factorisation to the
certificate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attacks.spearpp.config import SpearConfig
from attacks.spearpp.coupled import Coupling
from attacks.spearpp.factor import Factorisation
from attacks.spearpp.harvest import Clock, Harvester
from attacks.spearpp.hidden import NextBases
from attacks.spearpp.inputs import LayerObservation
from attacks.spearpp.pool import ColumnPool
from attacks.spearpp.signs import SignGeometry
from attacks.spearpp.solve import Solution
from attacks.spearpp.zero_rule import ZeroRule


@dataclass
class SpearState:
    """One attack in progress.

    ``generator`` feeds every random draw of the attack in stage order (factorisation, sign
    rounds, deflation, starts, repairs, isolation), so a stage moved or skipped changes every
    draw after it.
    """

    obs: LayerObservation
    config: SpearConfig
    generator: torch.Generator
    clock: Clock
    # perf_counter() when the attack began.
    started: float
    fac: Factorisation
    # The attack's settings as every record carries them.
    settings: dict[str, Any]
    # Null steps' rule (SpearConfig.null_step with "auto" resolved).
    null_step: str
    # The next layer's equations' weight in the scale fit (one-step noisy updates; 0: the
    # scales come from this layer's bias gradient alone; see attacks.spearpp.next_noise).
    next_weight: float
    rule: ZeroRule
    pool: ColumnPool
    harvest: Harvester
    out_of_time: Callable[[], bool]
    geom: SignGeometry | None = None
    # The next layer's bases where its row space holds the hidden vectors
    # (attacks.spearpp.hidden).
    hidden: NextBases | None = None
    # K of the coupled search where the next layer's weight is known (attacks.spearpp.coupled).
    coupling: Coupling | None = None
    sign_rounds: int = 0
    sign_starts: int = 0
    starts: int = 0
    passes: int = 0
    repairs: int = 0
    found: int = 0
    columns: torch.Tensor | None = None
    solution: Solution | None = None

    @property
    def batch_size(self) -> int:
        """B, the factorisation's estimate (or the declared one)."""
        return self.fac.batch_size
