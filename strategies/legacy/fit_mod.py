"""The client mod that lets the Message-API ClientApp speak SecAgg+'s legacy fit form.

Flower's ``secaggplus_mod`` hands the ClientApp the server's ``FitIns`` (``fitins.parameters``,
``fitins.config``) and reads the reply back as a ``FitRes``: this mod, placed after it, turns
the one into the ClientApp's ``arrays`` and ``config`` and its reply into the other. The
reply's ``audit`` record (the samples drawn) is dropped: under secure aggregation nothing of a
client's own travels beside its masked vector but its fit metrics, which are scalars.
"""

from __future__ import annotations

from collections.abc import Sequence

import flwr.compat.common.recorddict_compat as compat
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.common import (
    Code,
    FitRes,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from clients.reply import (
    ARRAYS,
    CLIENT,
    CONFIG,
    METRICS,
    NUM_EXAMPLES,
    OK,
    PARTITION_ID,
    REASON,
    STATUS,
    TRAIN_LOSS,
)


class ClientFailedError(RuntimeError):
    """A client's round failed: under SecAgg+ it has no update to mask, so it drops out."""


def legacy_fit_mod(keys: Sequence[str]) -> Mod:
    """The mod for a model whose ``state_dict`` has ``keys`` in this order (the legacy form
    carries arrays in order, without names).

    A failed round (diverged, client error) raises :class:`ClientFailedError` naming the client,
    its status and reason: the ClientApp's error reply makes the client a SecAgg+ dropout, whose
    masks the server removes with its neighbours' shares.
    """
    names = list(keys)

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if "fitins.parameters" not in msg.content.array_records:
            return call_next(msg, context)
        fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        arrays = parameters_to_ndarrays(fitins.parameters)
        # The handler reads the Message-API form; the message itself (its id, its sender) stays.
        msg.content = RecordDict(
            {
                ARRAYS: ArrayRecord(
                    {k: torch.from_numpy(a) for k, a in zip(names, arrays, strict=True)}
                ),
                CONFIG: ConfigRecord(dict(fitins.config)),
            }
        )
        reply = call_next(msg, context).content
        declared = reply.get(CLIENT)
        if not isinstance(declared, ConfigRecord):
            raise ClientFailedError(f"the ClientApp's reply has no ConfigRecord {CLIENT!r}")
        if declared.get(STATUS) != OK:
            raise ClientFailedError(
                f"client {declared.get(PARTITION_ID)!r}: {declared.get(STATUS)!r}: "
                f"{declared.get(REASON)!r}"
            )
        updated = reply[ARRAYS]
        metrics = reply[METRICS]
        if not isinstance(updated, ArrayRecord) or not isinstance(metrics, MetricRecord):
            raise ClientFailedError(f"the ClientApp's reply lacks {ARRAYS!r} or {METRICS!r}")
        examples, loss = metrics[NUM_EXAMPLES], metrics[TRAIN_LOSS]
        if not isinstance(examples, int | float) or not isinstance(loss, int | float):
            raise ClientFailedError(f"{NUM_EXAMPLES} and {TRAIN_LOSS} must be numbers")
        # Legacy fit metrics are scalars: what the client declared, and its training loss.
        scalars: dict[str, Scalar] = {
            k: v for k, v in declared.items() if isinstance(v, bool | int | float | str | bytes)
        }
        fitres = FitRes(
            status=Status(Code.OK, ""),
            parameters=ndarrays_to_parameters(updated.to_numpy_ndarrays()),
            num_examples=int(examples),
            metrics={**scalars, TRAIN_LOSS: float(loss)},
        )
        return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)

    return mod
