"""A check a client can run on the model it receives, before training on it: does its first
layer behave as honest training leaves one?

A ReLU layer that training (or initialisation) produced fires for about half of the samples
it sees, neuron by neuron: its biases are small next to what the weights make of an input. A
server that shapes the first layer to make a client's update give its batch away needs the
opposite: neurons that fire for few samples (``sparsify``), or for one (``trap``), or, under
secure aggregation, for none at all on every client but the target (``isolate``: their update
of the layer is then zero and the sum is the target's alone). The client measures all three on
its own batch, with nothing but the weights it was sent, and names the checks that fired
(:attr:`TamperCheck.checks`):

- :data:`DEAD`: no neuron fires for any sample of the batch;
- :data:`ACTIVE`: the share of (sample, neuron) pairs that are active lies outside
  [:data:`MIN_ACTIVE`, :data:`MAX_ACTIVE`] (not counted again for a dead layer);
- :data:`RARE_NEURONS`: the share of neurons that fire for some but at most :data:`RARE` of the
  batch exceeds :data:`MAX_RARE`.

Model inconsistency itself (the target was sent another model than the rest) cannot be seen by
one client alone: that takes comparing models across clients. What one client can see is its
own model's dead layer, so under ``isolate`` the check fires on every client but the target,
whose model is the honest one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The names of the checks, as a reply declares those that fired.
DEAD = "dead-layer"
ACTIVE = "active-share"
RARE_NEURONS = "rare-neurons"

# Honest first layers keep activation shares near 0.5; these bounds leave room for the drift of
# training on skewed data while catching a layer shifted to fire for a tenth of the samples.
MIN_ACTIVE = 0.25
MAX_ACTIVE = 0.75
# A neuron that fires for at most this share of a batch (but not for none) is a rare one:
# honest neurons almost never are (each fires for a sample with probability near 1/2).
RARE = 0.1
MAX_RARE = 0.25


@dataclass(frozen=True)
class TamperCheck:
    """What the check found.

    Attributes
    ----------
    flagged
        The first layer looks tampered with.
    checks
        The checks that fired (:data:`DEAD`, :data:`ACTIVE`, :data:`RARE_NEURONS`), in that
        order; empty when not flagged.
    reason
        Why, in words ('' when not flagged).
    active_share
        Share of (sample, neuron) pairs the batch activates.
    rare_share
        Share of neurons firing for some but at most :data:`RARE` of the batch.
    """

    flagged: bool
    checks: tuple[str, ...]
    reason: str
    active_share: float
    rare_share: float


def check_first_layer(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> TamperCheck:
    """Check a first layer (``weight`` m x n, ``bias`` m) against the client's own batch ``x``
    (B x n, as the layer takes it)."""
    active = (x.to(weight.dtype) @ weight.T + bias) > 0
    active_share = float(active.double().mean())
    firing = active.double().mean(dim=0)
    rare_share = float(((firing > 0) & (firing <= RARE)).double().mean())
    fired: dict[str, str] = {}
    if not active.any():
        fired[DEAD] = (
            "no neuron of the first layer fires for any sample of the batch: its update of "
            "that layer is zero"
        )
    elif not MIN_ACTIVE <= active_share <= MAX_ACTIVE:
        fired[ACTIVE] = (
            f"the batch activates {active_share:.3f} of the first layer "
            f"(honest: {MIN_ACTIVE}..{MAX_ACTIVE})"
        )
    if rare_share > MAX_RARE:
        fired[RARE_NEURONS] = (
            f"{rare_share:.3f} of the neurons fire for at most {RARE:.0%} of the batch "
            f"(honest: at most {MAX_RARE})"
        )
    return TamperCheck(
        bool(fired), tuple(fired), "; ".join(fired.values()), active_share, rare_share
    )
