"""Central DP with Flower's fixed-clipping wrappers, and the epsilon it claims.

``DifferentialPrivacyClientSideFixedClipping`` (the clients clip with ``fixedclipping_mod``) or
``DifferentialPrivacyServerSideFixedClipping`` (the wrapper clips) add Gaussian noise to the
aggregate only: a strategy outside the wrapper, as the honest-but-curious server is, receives
every update clipped (client side) or as sent (server side), never noised.

The epsilon claimed is :meth:`fl_sim.config.federation.CentralDpSpec.epsilon`'s.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from fl_sim.config.federation import CentralDpSpec
from fl_sim.config.schema import Scenario


def with_central_dp(strategy: Strategy, spec: CentralDpSpec, num_clients: int) -> Strategy:
    """``strategy`` inside Flower's fixed-clipping DP wrapper that ``spec.clipping`` names."""
    wrapper = (
        DifferentialPrivacyClientSideFixedClipping
        if spec.clipping == "client"
        else DifferentialPrivacyServerSideFixedClipping
    )
    return wrapper(strategy, spec.noise_multiplier, spec.clipping_norm, num_clients)


def central_epsilon(scenario: Scenario) -> Callable[[int], float] | None:
    """Round -> the federation's (epsilon, ``delta``)-DP after that many noised aggregates
    (``None`` without central DP)."""
    spec = scenario.federation.central_dp
    return None if spec is None else spec.epsilon
