"""The attacker: sees only what an honest-but-curious server sees.

Nothing here imports the simulated world (``clients``, ``fl_sim``): inputs are the weights as
the server sent them (the first layer's, or the whole model's with its architecture), the
client's update turned into a gradient, and whatever the client declared.

Three attacks, registered by name in :data:`ATTACKS` by their modules in
:mod:`attacks.plugins` (:func:`run_attack` runs one on a :class:`ServerView`): ``spearpp``,
exact reconstruction from the first layer (:func:`reconstruct`), ``inversion``,
optimisation-based gradient matching on the whole model (:func:`invert_gradients`), and
``analytic``, the samples single neurons isolate (what trap weights are laid for).
"""

from __future__ import annotations

import attacks.plugins  # noqa: F401  (each of its modules registers an attack)
from attacks.analytic import AnalyticConfig
from attacks.errors import AttackInputError
from attacks.inversion import InversionConfig, invert_gradients
from attacks.plugin import ATTACKS, AttackPlugin, AttackTable, run_attack
from attacks.result import Reconstruction
from attacks.spearpp import PRESETS, SpearConfig, paper_config, run_spearpp
from attacks.spearpp.inputs import ArrayLike, NextArrays, observe_layer, resolve_device
from attacks.view import ServerView


def reconstruct(
    grad_weight: ArrayLike,
    grad_bias: ArrayLike,
    weight: ArrayLike,
    bias: ArrayLike,
    *,
    batch_size: int | None = None,
    noise_std: float | None = None,
    next_layer: NextArrays | None = None,
    config: SpearConfig | None = None,
) -> Reconstruction:
    """Reconstruct a client's batch from the gradient of a linear layer followed by ReLU.

    Parameters
    ----------
    grad_weight, grad_bias
        Gradient of the layer's weight (m x n) and bias (m); for a multi-step update, the weight
        change divided by -lr.
    weight, bias
        The layer's weight and bias as the server sent them.
    batch_size
        The batch size, if the attacker knows it; estimated from the gradient's rank otherwise.
    noise_std
        Per-entry std of noise added to the gradient (DP-SGD: sigma * C / batch size), if known;
        zero tolerances then follow it.
    next_layer
        Gradient of the next linear layer's weight (k x m) and bias (k), the layer that takes
        this one's ReLU output, for a one-step update only (FedSGD, one DP-SGD step): under
        noise it fixes each sample's scale far better than this layer's bias gradient; with
        that layer's weight (k x m, as sent) as a third array, it ties each sample's column
        to its output gradient there (see :mod:`attacks.spearpp.coupled`).
    config
        Search settings; the default is :class:`SpearConfig` ().

    Returns
    -------
    Reconstruction
        ``inputs`` (B_hat x n, the layer's input space), ``batch_size``, ``status``, ``timings``
        and the rest.

    Raises
    ------
    AttackInputError
        For inputs that cannot be attacked as given (the message names which and why).
    """
    config = config or SpearConfig()
    obs = observe_layer(
        grad_weight, grad_bias, weight, bias, resolve_device(config.device), next_layer
    )
    return run_spearpp(obs, batch_size=batch_size, noise_std=noise_std, config=config)


__all__ = [
    "ATTACKS",
    "PRESETS",
    "AnalyticConfig",
    "AttackInputError",
    "AttackPlugin",
    "AttackTable",
    "InversionConfig",
    "Reconstruction",
    "ServerView",
    "SpearConfig",
    "invert_gradients",
    "paper_config",
    "reconstruct",
    "run_attack",
]
