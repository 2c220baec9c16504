"""``ServerCore``: what the server sends each client, round by round, and what follows from it
for the replies it sums, whichever Flower API carries the messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strategies.behaviours import BEHAVIOURS, BehaviourSettings
from strategies.core.partitions import Partitions

Layer = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class SentSum:
    """What a weighted sum of replies was taken at: the attacked layer as sent.

    Attributes
    ----------
    weight, bias
        The summed clients' sent layers weighted as in the sum (float64): what the sum would be
        had no client trained.
    trained_at
        The one layer every summed client whose layer can train was sent (float64), or ``None``
        (see :func:`single_trained_layer`).
    """

    weight: np.ndarray
    bias: np.ndarray
    trained_at: Layer | None


class ServerCore:
    """The server behaviour ``settings`` names, applied round by round.

    Each round the behaviour is asked once (:meth:`send`) for the first layer of every node
    the round may reach, and one more for a node it did not know of then; the core remembers
    what it sent, so that an update is set against the layer its client trained from and the
    global model is moved back onto the honest one (:meth:`honest_shift`), the model a server
    that lies only to its clients keeps.

    Parameters
    ----------
    settings
        The behaviour's settings; their name picks the registered behaviour.
    public
        Inputs the server holds itself (N x n, as the first layer takes them), for the
        behaviour's statistics.
    seed
        Seeds the behaviour's randomness: round r draws from ``default_rng([seed, r])``.
    partitions
        Which client each node is (shared with the rest of the server; default: its own).

    Notes
    -----
    The server tells which client a node is from what the node declares in the clear with each
    reply (its partition id, :attr:`partitions`); a node not yet seen is ``None`` to the
    behaviour.
    """

    def __init__(
        self,
        settings: BehaviourSettings,
        public: np.ndarray,
        seed: int,
        partitions: Partitions | None = None,
    ) -> None:
        self.settings = settings
        self.behaviour = BEHAVIOURS[settings.behaviour]
        self.public = public
        self.seed = seed
        self.partitions = partitions or Partitions()
        self._honest: dict[int, Layer] = {}
        self._sent: dict[int, dict[int | None, Layer]] = {}

    def send(
        self, server_round: int, nodes: Sequence[int], weight: np.ndarray, bias: np.ndarray
    ) -> None:
        """Ask the behaviour for this round's first layer of each of ``nodes`` (and of a node
        not among them) given the honest ``weight`` and ``bias``; each is cast to their dtype.
        Only this round's layers are kept."""
        rng = np.random.default_rng([self.seed, server_round])
        keys: list[int | None] = [*nodes, None]
        clients = [None if n is None else self.partitions.of(n) for n in keys]
        layers = self.behaviour.layers(clients, weight, bias, self.public, self.settings, rng)
        self._honest = {server_round: (weight, bias)}
        self._sent = {
            server_round: {
                node: (w.astype(weight.dtype, copy=False), b.astype(bias.dtype, copy=False))
                for node, (w, b) in zip(keys, layers, strict=True)
            }
        }

    def sent_to(self, server_round: int, node: int | None) -> Layer:
        """The first layer ``node`` was sent in ``server_round`` (``None``: the one for a node
        :meth:`send` was not told of)."""
        sent = self._sent[server_round]
        return sent.get(node, sent[None])

    def uniform(self, server_round: int) -> Layer | None:
        """The layer every node was sent in ``server_round``, if they were all sent the same
        one; else ``None``."""
        layers = list(self._sent[server_round].values())
        first = layers[0]
        if all(same_layer(layer, first) for layer in layers[1:]):
            return first
        return None

    def summed(self, server_round: int, weights: Sequence[tuple[int, float]]) -> SentSum:
        """What the sum of the replies of ``weights``' nodes, each weighted by its weight, was
        taken at (the weights need not sum to 1)."""
        layers = [self.sent_to(server_round, node) for node, _ in weights]
        weight, bias = _weighted_mean(layers, [w for _, w in weights])
        return SentSum(weight, bias, single_trained_layer(layers))

    def honest_shift(self, server_round: int, weights: Sequence[tuple[int, float]]) -> Layer:
        """What to add (float64) to the weighted mean of the replies of ``weights``' nodes to
        make it the honest layer plus their mean update: honest minus the weighted mean of
        what they were sent."""
        layers = [self.sent_to(server_round, node) for node, _ in weights]
        sent_weight, sent_bias = _weighted_mean(layers, [w for _, w in weights])
        honest_weight, honest_bias = self._honest[server_round]
        return (
            honest_weight.astype(np.float64) - sent_weight,
            honest_bias.astype(np.float64) - sent_bias,
        )


def _weighted_mean(layers: Sequence[Layer], weights: Sequence[float]) -> Layer:
    """The layers' weighted mean, in float64."""
    if all(same_layer(layer, layers[0]) for layer in layers[1:]):
        # One layer for all: its weighted mean is itself, with no rounding.
        return layers[0][0].astype(np.float64), layers[0][1].astype(np.float64)
    total = float(sum(weights))
    weight, bias = (
        np.sum(
            [w * layer[i].astype(np.float64) for w, layer in zip(weights, layers, strict=True)],
            axis=0,
        )
        / total
        for i in (0, 1)
    )
    return weight, bias


def same_layer(a: Layer, b: Layer) -> bool:
    """Whether two layers hold the same values (the same arrays, at no cost)."""
    if a[0] is b[0] and a[1] is b[1]:
        return True
    return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def never_fires(weight: np.ndarray, bias: np.ndarray) -> bool:
    """Whether a ReLU layer's neurons are inactive for every input: each pre-activation is
    then its bias, and the layer's gradient is zero for every sample."""
    return not weight.any() and bool((bias <= 0).all())


def single_trained_layer(layers: Sequence[Layer]) -> Layer | None:
    """The one layer the clients whose layer can train were sent (float64), or ``None`` where
    they were sent different ones (or none can train): then no single layer explains their
    sum. A layer that never fires leaves its clients' updates of it zero, so a server that
    sends it to all but one client (``isolate``) attacks the target's layer."""
    # Each distinct layer once: a round's clients mostly share one (the same arrays).
    distinct: list[Layer] = []
    for layer in layers:
        if not any(same_layer(layer, seen) for seen in distinct):
            distinct.append(layer)
    live = [layer for layer in distinct if not never_fires(*layer)]
    if len(live) != 1:
        return None
    weight, bias = live[0]
    return weight.astype(np.float64), bias.astype(np.float64)
