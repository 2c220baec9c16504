"""What the honest-but-curious server holds of a round under secure aggregation: the sum."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class InterceptedAggregate:
    """One round's unmasked aggregate, as SecAgg+ hands it to the strategy, reduced to the
    attacked layer: no single client's update is in it, only the cohort's weighted average.

    Attributes
    ----------
    server_round
        When.
    node_ids
        The clients whose masked vectors were summed.
    declared
        What each of them declared in the clear (its fit metrics: partition id, defence, lr,
        batch size...), in the order of ``node_ids``.
    num_examples
        Each one's weight in the average, in the same order.
    dropped
        Nodes sampled this round whose masked vector never came: SecAgg+ removed their masks
        from the sum with their neighbours' shares, and their update is not in it.
    sent_weight, sent_bias
        The layer as the server sent it this round: the summed clients' layers weighted as in
        the sum (by ``num_examples``; one and the same layer unless the server sent each client
        its own), which is what the sum would be had no client trained.
    weight, bias
        The layer of the aggregate.
    trained_at
        The layer every summed client whose layer can train was sent, where they were all sent
        the same one: the weights the sum's gradient was taken at. A layer that never fires
        (zero weights, no positive bias) leaves its clients' updates of it zero, so a server
        that sends it to all but one client (``isolate``) attacks the target's layer, not the
        weighted average of the sent ones. ``None`` where those clients were sent different
        layers (or none can train): then no single layer explains the sum.
    """

    server_round: int
    node_ids: tuple[int, ...]
    declared: tuple[Mapping[str, Any], ...]
    num_examples: tuple[int, ...]
    dropped: tuple[int, ...]
    sent_weight: np.ndarray
    sent_bias: np.ndarray
    weight: np.ndarray
    bias: np.ndarray
    trained_at: tuple[np.ndarray, np.ndarray] | None
