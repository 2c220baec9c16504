"""Central DP with Flower's fixed-clipping wrappers, and the epsilon it claims.

``DifferentialPrivacyClientSideFixedClipping`` (the clients clip with ``fixedclipping_mod``) or
``DifferentialPrivacyServerSideFixedClipping`` (the wrapper clips) add Gaussian noise to the
aggregate only: a strategy outside the wrapper, as the honest-but-curious server is, receives
every update clipped (client side) or as sent (server side), never noised.

Flower's own accountant (``flwr.serverapp.PrivacyAccountant``, backed by
``flwr.supercore.privacy_accounting.rdp_accountant.RdpAccountant``) needs Google's
``dp-accounting`` package, which fl-sim does not install: the epsilon here is Opacus' RDP
accountant's for the same mechanism, Flower's noise multiplier on a release of every client
each round (sampling rate 1, no amplification, as Flower's accountant counts it).
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from clients import PrivacyLedger
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
    if spec is None:
        return None

    def epsilon(server_round: int) -> float:
        return PrivacyLedger().spend(spec.noise_multiplier, 1.0, server_round).epsilon(spec.delta)

    return epsilon
