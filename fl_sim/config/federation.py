"""Federation-wide defences (``[federation]``): Flower's SecAgg+ and its central DP wrappers.

Frozen pydantic models, validated once when the scenario is read; :mod:`fl_sim.config.load`
turns their errors into :class:`~fl_sim.config.load.ConfigError` naming the dotted key.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from clients import PrivacyLedger


class SecAggSpec(BaseModel):
    """Flower's SecAgg+ (``[federation.secagg]``): the server receives only the masked,
    quantised sum of the cohort's replies. Defaults are ``SecAggPlusWorkflow``'s.

    Parameters
    ----------
    num_shares
        Shares each client's secret is split into (an int > 2, or a float in (0, 1]: that share
        of the cohort).
    reconstruction_threshold
        Shares needed to reconstruct a secret (an int < ``num_shares``, or a float in (0, 1]:
        that share of the shares); fewer surviving neighbours abort the round.
    clipping_range
        Every parameter is clipped to +- this before quantisation.
    quantization_range
        Levels each parameter is quantised to.
    max_weight
        Largest client weight (``num-examples``) SecAgg+ scales by before quantising.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    num_shares: int | float = Field(default=3)
    reconstruction_threshold: int | float = Field(default=2)
    clipping_range: float = Field(default=8.0, gt=0)
    quantization_range: int = Field(default=2**22, gt=0, lt=2**32)
    max_weight: float = Field(default=1000.0, gt=0)

    @field_validator("num_shares")
    @classmethod
    def _num_shares(cls, shares: int | float) -> int | float:
        if isinstance(shares, int) and shares <= 2:
            raise ValueError("an integer must be > 2 (a float: that share of the cohort)")
        if isinstance(shares, float) and not 0 < shares <= 1:
            raise ValueError("a float must lie in (0, 1] (an integer: > 2)")
        return shares

    @field_validator("reconstruction_threshold")
    @classmethod
    def _threshold(cls, threshold: int | float) -> int | float:
        if isinstance(threshold, int) and threshold < 2:
            raise ValueError("an integer must be >= 2 (a float: that share of num_shares)")
        if isinstance(threshold, float) and not 0 < threshold <= 1:
            raise ValueError("a float must lie in (0, 1] (an integer: >= 2)")
        return threshold

    @model_validator(mode="after")
    def _below_shares(self) -> SecAggSpec:
        shares, threshold = self.num_shares, self.reconstruction_threshold
        if isinstance(shares, int) and isinstance(threshold, int) and threshold >= shares:
            raise ValueError(
                f"reconstruction_threshold = {threshold} must be < num_shares = {shares}"
            )
        return self


class CentralDpSpec(BaseModel):
    """Flower's central DP with fixed clipping (``[federation.central_dp]``).

    Parameters
    ----------
    noise_multiplier
        Gaussian noise std over the clipping norm, added to the aggregate.
    clipping_norm
        L2 norm each client's model update is clipped to.
    clipping
        ``client``: clipped by ``fixedclipping_mod`` on the clients
        (``DifferentialPrivacyClientSideFixedClipping``); ``server``: clipped by the server's
        wrapper (``DifferentialPrivacyServerSideFixedClipping``).
    delta
        The delta at which the run reports epsilon.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    noise_multiplier: float = Field(default=1.0, gt=0)
    clipping_norm: float = Field(default=1.0, gt=0)
    clipping: Literal["client", "server"] = "client"
    delta: float = Field(default=1e-5, gt=0, lt=1)

    def epsilon(self, rounds: int) -> float:
        """The federation's epsilon at :attr:`delta` after ``rounds`` noised aggregates.

        Opacus' RDP accountant for Flower's mechanism: the noise multiplier on a release of
        every client each round (sampling rate 1, no amplification, as Flower's own accountant
        counts it; that one needs Google's ``dp-accounting``, which fl-sim does not install).
        """
        return PrivacyLedger().spend(self.noise_multiplier, 1.0, rounds).epsilon(self.delta)


class FederationSpec(BaseModel):
    """The ``[federation]`` table: at most one federation-wide defence."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    secagg: SecAggSpec | None = None
    central_dp: CentralDpSpec | None = None

    @property
    def wide_defence(self) -> bool:
        """Whether a federation-wide defence (SecAgg+, central DP) is on: its client mods are
        fixed when the ClientApp is built, and its state lives in Flower's workflow, not on
        disk (such a run does not resume)."""
        return self.secagg is not None or self.central_dp is not None

    @model_validator(mode="after")
    def _one(self) -> FederationSpec:
        # Flower's SecAgg+ runs on the legacy workflow, its DP wrappers on the Message API:
        # they do not compose.
        if self.secagg is not None and self.central_dp is not None:
            raise ValueError("secagg and central_dp: choose one (Flower does not combine them)")
        return self
