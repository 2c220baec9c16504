"""``Partitions``: which client each node is, as the server learns it."""

from __future__ import annotations


class Partitions:
    """Node id -> partition id, learnt from what each node declares in the clear with its
    replies (its partition id; under SecAgg+ in the fit metrics it leaves unmasked).

    Flower's node ids are random: this is how the server tells clients apart, attributes a
    reply that carries nothing (Flower's error reply) to its client, and sends a client its own
    layer. One instance serves every part of the server that needs it.
    """

    def __init__(self) -> None:
        self._of: dict[int, int] = {}

    def learn(self, node: int, client: object) -> None:
        """Note that ``node`` declared partition id ``client`` (ignored unless an int)."""
        if isinstance(client, int) and not isinstance(client, bool):
            self._of[node] = client

    def of(self, node: int) -> int | None:
        """The partition id ``node`` declared, or ``None`` before it said."""
        return self._of.get(node)

    def known(self) -> dict[int, int]:
        """Every node told apart so far, with its partition id."""
        return dict(self._of)
