"""The threat model: what an honest-but-curious server sees and knows of what it intercepted,
i.e. the attack's inputs.

Pure: an intercepted update (with what its client declared) or a SecAgg+ round's sum (with
the federation's settings) goes in, a :class:`Sight` comes out: the update as a gradient, the
server's weights, and what the attack may be told (batch size, noise level, the next layer,
input bounds), each item with how the server came by it, as the records say it. No file is
read or written here and no ground truth enters (labels the attack is told come from the
caller, who holds them).

The noise a defence adds is the defence's own knowledge rule
(:meth:`clients.defences.Defence.disclose`); this module combines the rules with the
server's own round-off estimate and the scenario's ``knows_noise``, ``knows_batch_size``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from torch import nn

from attacks import ServerView
from clients.defences import Disclosure, declared_defences
from clients.defences.base import (
    BATCH_SIZE,
    LR,
    STEPS,
    combined_noise,
    declared_count,
    declared_rate,
)
from clients.defences.dp import NOISE_STD
from fl_sim.config.federation import SecAggSpec
from fl_sim.data.description import DataDescription
from strategies import InterceptedAggregate, InterceptedUpdate, update_as_gradient
from strategies.quantisation import secagg_noise_std

# What the record says when the attack is given no noise level at all.
NOISE_NOT_TOLD = "not told: estimated from the gradient's spectrum"


def disclosures(
    declared: Mapping[str, object], weight_update: np.ndarray | None
) -> list[Disclosure]:
    """What each defence the reply declares lets the server tell the attack (its knowledge
    rule, :meth:`clients.defences.Defence.disclose`)."""
    return [d.disclose(declared, weight_update) for d in declared_defences(declared)]


def next_layer_helps(declared: Mapping[str, object]) -> bool:
    """Whether a defence of the reply makes it one step: its next layer's gradient is then of
    the same batch, and SPEAR++ fixes the samples' scales under noise from it far better than
    from the first layer's bias gradient alone, and the inputs the first layer leaves open
    (worth keeping the reply whole for)."""
    return any(d.next_layer for d in disclosures(declared, None))


def rounding_noise(received: np.ndarray, lr: float) -> float:
    """Per-entry std of (sent - received) / lr due to rounding ``received`` to its dtype, for
    one local step (each step rounds again: the caller scales by sqrt(steps)).

    Rounding to nearest errs uniformly within half a unit in the last place: std ulp / sqrt(12).
    Zero for float64 weights, whose round-off sits below the attack's own tolerance.
    """
    if received.dtype == np.float64:
        return 0.0
    ulp = np.spacing(np.abs(received)).astype(np.float64)
    return float(np.sqrt(np.mean(ulp**2) / 12.0)) / lr


@dataclass(frozen=True)
class Sight:
    """What the attacker sees and knows of one intercepted update or sum.

    Attributes
    ----------
    view
        The attack's inputs: the server's weights and the update as a gradient (float64, by
        ArrayRecord key) and what it is told.
    knowledge
        How the server came by each item (``lr``: ``declared`` or ``assumed 1``, ``noise``:
        ``declared + rounding``, ...), as every record says it.
    """

    view: ServerView
    knowledge: Mapping[str, str]


@dataclass(frozen=True)
class ThreatModel:
    """The honest-but-curious server of a scenario: what it holds and may use.

    Attributes
    ----------
    first_layer
        ArrayRecord keys of the attacked layer's weight and bias.
    knows_batch_size
        The attack is told the batch size a client declares.
    knows_noise
        The attack is told the noise level the declared defences and the round-off imply
        (else none at all: it fits the noise to the gradient's spectrum).
    next_layer
        Keys of the next linear layer, when the server knows which one that is.
    architecture
        The model the server built (structure only), for whole-model attacks.
    data
        The server's input pipeline (shape, normalisation), for whole-model attacks.
    """

    first_layer: tuple[str, str]
    knows_batch_size: bool
    knows_noise: bool
    next_layer: tuple[str, str] | None = None
    architecture: nn.Module | None = None
    data: DataDescription | None = None

    def of_update(
        self,
        update: InterceptedUpdate,
        whole_model: bool = False,
        labels: tuple[int, ...] | None = None,
    ) -> Sight:
        """What the server sees of one client's update: its first layer (and, for a one-step
        noisy update kept whole, the next layer) as a gradient, or with ``whole_model`` every
        array as the mean step; ``labels``: the batch's labels, when the attack is told them.

        Raises
        ------
        ValueError
            For ``whole_model`` without :attr:`architecture` and :attr:`data`.
        """
        declared = update.declared
        received_weight, _ = update.received_layer()
        # A user's own app may declare anything: what is not a usable number counts as unsaid.
        told_lr = declared_rate(declared, LR)
        lr = told_lr or 1.0
        steps = declared_count(declared, STEPS) or 1
        knowledge = {"lr": "declared" if told_lr else "assumed 1"}
        batch_size = None
        told_size = declared_count(declared, BATCH_SIZE)
        if self.knows_batch_size and told_size:
            batch_size = told_size
            knowledge["batch_size"] = "declared"
        else:
            knowledge["batch_size"] = "estimated"
        # The weights arrive rounded to their dtype (float32): the difference of two rounded
        # weights carries that round-off, amplified by 1 / lr, as noise the server can compute.
        rounding = rounding_noise(received_weight, lr) * math.sqrt(steps)
        noise_std = rounding
        knowledge["noise"] = "rounding" if rounding else "none"
        noisy = [
            d
            for d in disclosures(declared, received_weight.astype(np.float64) - update.sent_weight)
            if d.adds_noise
        ]
        suffix = " + rounding" if rounding else ""
        if not self.knows_noise:
            # Told nothing: the attack fits the noise (DP and round-off alike) to the spectrum.
            noise_std = 0.0
            knowledge["noise"] = NOISE_NOT_TOLD
        elif any(d.noise_std is None for d in noisy):
            knowledge["noise"] = "unknown" + suffix
        elif noisy:
            noise_std = combined_noise(noisy, rounding)
            knowledge["noise"] = "declared" + suffix
        if whole_model:
            view = self._whole(update, lr, steps, noise_std, labels, knowledge)
        else:
            view = self._first_layer(update, lr, noise_std, knowledge)
        view = dataclasses.replace(view, batch_size=batch_size)
        return Sight(view, MappingProxyType(knowledge))

    def of_aggregate(self, aggregate: InterceptedAggregate, secagg: SecAggSpec) -> Sight:
        """What the server sees of a SecAgg+ round's sum: the averaged first layer as one
        gradient of every summed client's samples, told (with :attr:`knows_noise`) the
        quantisation noise of Flower's settings and the summed clients' weights, and (with
        :attr:`knows_batch_size`) the total of their declared batch sizes."""
        lrs = [float(d.get(LR, 1.0)) for d in aggregate.declared]
        # One step of every client at one lr makes the average step lr times the gradient of
        # the union batch; with several lrs the columns are rescaled, which SPEAR++ ignores.
        lr = sum(lrs) / len(lrs)
        knowledge = {"lr": "declared" if len(set(lrs)) == 1 else "mean of the declared lrs"}
        knowledge["view"] = (
            f"the SecAgg+ sum of {len(lrs)} clients: one batch of their samples together"
        )
        batch_size = None
        sizes = [d.get(BATCH_SIZE) for d in aggregate.declared]
        declared_sizes = [b for b in sizes if isinstance(b, int)]
        if self.knows_batch_size and len(declared_sizes) == len(sizes):
            batch_size = sum(declared_sizes)
            knowledge["batch_size"] = "sum of the declared"
        else:
            knowledge["batch_size"] = "estimated"
        noise_std = 0.0
        if self.knows_noise:
            weights = aggregate.num_examples
            quantisation = secagg_noise_std(
                weights, secagg.clipping_range, secagg.quantization_range, secagg.max_weight
            )
            # Each DP client's own noise, weighted into the average as its update is; it is
            # declared in gradient units already, the quantisation's is in the weights'.
            dp = math.sqrt(
                sum(
                    (n * float(d.get(NOISE_STD, 0.0))) ** 2 * int(d.get(STEPS, 1))
                    for n, d in zip(weights, aggregate.declared, strict=True)
                )
            ) / sum(weights)
            noise_std = math.hypot(quantisation / lr, dp)
            knowledge["noise"] = "SecAgg+ quantisation" + (" + declared DP" if dp else "")
        else:
            knowledge["noise"] = NOISE_NOT_TOLD
        w_key, b_key = self.first_layer
        sent = {w_key: aggregate.sent_weight, b_key: aggregate.sent_bias}
        summed = {w_key: aggregate.weight, b_key: aggregate.bias}
        # The weights the sum's gradient was taken at: the average of the sent layers is one
        # only when every client that could train was sent the same layer (isolate sends the
        # others a dead one, and their average is no layer any sample saw).
        at = sent
        if aggregate.trained_at is not None:
            at = dict(zip((w_key, b_key), aggregate.trained_at, strict=True))
            knowledge["weights"] = "the layer every client that could train was sent"
        else:
            knowledge["weights"] = "the average of the layers sent (no one layer was trained)"
        view = ServerView(
            weights={k: v.astype(np.float64) for k, v in at.items()},
            gradient=_gradient(sent, summed, lr),
            first_layer=self.first_layer,
            batch_size=batch_size,
            noise_std=noise_std or None,
        )
        return Sight(view, MappingProxyType(knowledge))

    def _first_layer(
        self, update: InterceptedUpdate, lr: float, noise_std: float, knowledge: dict[str, str]
    ) -> ServerView:
        """The first layer's view; for a one-step noisy update kept whole, the next layer's
        gradient too."""
        w_key, b_key = self.first_layer
        weight, bias = update.received_layer()
        sent = {w_key: update.sent_weight, b_key: update.sent_bias}
        received = {w_key: weight, b_key: bias}
        nxt = self.next_layer
        if not (update.arrays is not None and next_layer_helps(update.declared)):
            nxt = None
        if nxt is not None:
            sent_all, received_all = update.whole()
            sent |= {k: sent_all[k] for k in nxt}
            received |= {k: received_all[k] for k in nxt}
            knowledge["next_layer"] = (
                "one step: its gradient fixes the samples' scales under noise and the inputs "
                "the first layer leaves open; with its weight it ties each sample's column to "
                "its output gradient there"
            )
        return ServerView(
            weights={k: v.astype(np.float64) for k, v in sent.items()},
            gradient=_gradient(sent, received, lr),
            first_layer=self.first_layer,
            next_layer=nxt,
            noise_std=noise_std or None,
        )

    def _whole(
        self,
        update: InterceptedUpdate,
        lr: float,
        steps: int,
        noise_std: float,
        labels: tuple[int, ...] | None,
        knowledge: dict[str, str],
    ) -> ServerView:
        """Every array and the view of a whole-model attack."""
        if self.architecture is None or self.data is None:
            raise ValueError("a whole-model attack needs the model's architecture and the data")
        sent_all, received_all = update.whole()
        # The standard threat model for multi-step updates: match the pseudo-gradient, here
        # the mean step, (sent - received) / (lr * steps), the scale of one batch gradient.
        gradient = {k: g / steps for k, g in _gradient(sent_all, received_all, lr).items()}
        knowledge["gradient"] = f"update / (lr x {steps} steps)"
        knowledge["labels"] = "told" if labels is not None else "recovered"
        norm = self.data.normalization
        bounds = None
        # The attack registry shapes bounds per image channel (C x 1 x 1): a record's features
        # would not broadcast, so tabular records go unbounded.
        if self.data.is_image:
            bounds = (
                tuple((0 - m) / s for m, s in zip(norm.mean, norm.std, strict=True)),
                tuple((1 - m) / s for m, s in zip(norm.mean, norm.std, strict=True)),
            )
            knowledge["bounds"] = "pixel range through the normalisation"
        else:
            knowledge["bounds"] = "none (per-channel bounds are for images)"
        return ServerView(
            weights={k: v.astype(np.float64) for k, v in sent_all.items()},
            gradient=gradient,
            first_layer=self.first_layer,
            architecture=self.architecture,
            input_shape=self.data.input_shape,
            noise_std=(noise_std / steps) or None,
            labels=labels,
            bounds=bounds,
        )


def _gradient(
    sent: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray], lr: float
) -> dict[str, np.ndarray]:
    """(sent - received) / lr per array, in float64."""
    return {
        k: update_as_gradient(sent[k].astype(np.float64), received[k].astype(np.float64), lr)
        for k in sent
    }
