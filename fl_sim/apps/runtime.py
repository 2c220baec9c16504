"""Which Flower runtime runs a scenario: ``flwr run`` with the simulation runtime
(:mod:`fl_sim.apps.flwr_simulation`), Flower's supported path, unless the scenario needs the
deprecated in-process ``run_simulation`` (:mod:`fl_sim.apps.in_process`)."""

from __future__ import annotations

from fl_sim.config.load import ConfigError
from fl_sim.config.schema import Scenario

# The runtimes ``fl-sim run --runtime`` offers: Flower's ``flwr run`` with the simulation
# runtime, and the deprecated in-process ``run_simulation`` (fl_sim.apps.in_process).
FLWR = "flwr"
LEGACY = "legacy"
AUTO = "auto"
RUNTIMES = (AUTO, FLWR, LEGACY)
# What the setup line and scenario.json say of each.
RUNTIME_LABELS = {
    FLWR: "flwr run (simulation runtime)",
    LEGACY: "run_simulation (deprecated, in-process)",
}


class RuntimeChoiceError(ConfigError):
    """A runtime that cannot run the scenario, or none of :data:`RUNTIMES`."""


def legacy_reasons(scenario: Scenario) -> list[str]:
    """Why ``scenario`` cannot run on ``flwr run``'s simulation runtime (empty: it can).

    Parameters
    ----------
    scenario
        The run.

    Returns
    -------
    list of str
        One reason per setting that needs ``run_simulation``.
    """
    reasons = []
    federation = scenario.federation
    if federation.secagg is not None:
        reasons.append(
            "[federation.secagg] (SecAgg+) needs client mods fixed when the ClientApp is built, "
            "which fl-sim's module-level ClientApp for flwr run does not choose"
        )
    if federation.central_dp is not None:
        reasons.append(
            "[federation.central_dp] needs client mods fixed when the ClientApp is built, "
            "which fl-sim's module-level ClientApp for flwr run does not choose"
        )
    address = scenario.cluster.ray_address()
    if address != "local":
        reasons.append(
            f"a Ray cluster ({address}, [cluster] address or $RAY_ADDRESS): Flower's "
            "federation config takes no Ray address, and fl-sim has not tried flwr run on one"
        )
    if float(scenario.client_cpus) != int(scenario.client_cpus):
        reasons.append(
            f"resources.client_cpus = {scenario.client_cpus}: the simulation runtime takes "
            "whole CPUs per client"
        )
    return reasons


def choose_runtime(scenario: Scenario, requested: str = AUTO) -> str:
    """The runtime ``scenario`` runs on: ``requested``, or with ``auto`` :data:`FLWR` unless
    :func:`legacy_reasons` names a reason, then :data:`LEGACY`.

    Parameters
    ----------
    scenario
        The run.
    requested
        One of :data:`RUNTIMES`.

    Returns
    -------
    str
        :data:`FLWR` or :data:`LEGACY`.

    Raises
    ------
    RuntimeChoiceError
        When ``requested`` is unknown, or is :data:`FLWR` for a scenario it cannot run.
    """
    if requested not in RUNTIMES:
        raise RuntimeChoiceError(f"runtime {requested!r}: allowed are {', '.join(RUNTIMES)}")
    reasons = legacy_reasons(scenario)
    if requested == AUTO:
        return LEGACY if reasons else FLWR
    if requested == FLWR and reasons:
        raise RuntimeChoiceError(
            f"--runtime {FLWR} cannot run scenario {scenario.name!r}: "
            + "; ".join(reasons)
            + f". Allowed for it: --runtime {LEGACY} (or {AUTO}, which chooses it)"
        )
    return requested
