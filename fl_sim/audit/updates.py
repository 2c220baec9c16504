"""Intercepted updates on disk (``updates/``), so that ``fl-sim audit RUN_DIR`` can resume or
redo an audit."""

from __future__ import annotations

import json
import logging
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fl_sim.rundir import write_npz
from strategies import InterceptedUpdate

log = logging.getLogger(__name__)


def save_update(update: InterceptedUpdate, path: Path) -> None:
    """Store an intercepted update (arrays as received, declarations as JSON; every array as
    sent and received when it was kept whole).

    Raises
    ------
    ValueError
        For an update with a problem, of which nothing was kept.
    """
    weight, bias = update.received_layer()
    path.parent.mkdir(parents=True, exist_ok=True)
    whole: dict[str, Any] = {}
    if update.sent_arrays is not None and update.arrays is not None:
        whole = {f"sent:{k}": v for k, v in update.sent_arrays.items()}
        whole |= {f"received:{k}": v for k, v in update.arrays.items()}
    arrays = dict(
        sent_weight=update.sent_weight,
        sent_bias=update.sent_bias,
        weight=weight,
        bias=bias,
        meta=np.asarray(
            json.dumps(
                {
                    "server_round": update.server_round,
                    "node_id": update.node_id,
                    "declared": dict(update.declared),
                    "audit": dict(update.audit),
                }
            )
        ),
        **whole,
    )
    write_npz(path, arrays)  # whole or not at all: a kill meanwhile leaves no torn update


def load_update(path: Path) -> InterceptedUpdate:
    """Inverse of :func:`save_update`."""
    with np.load(path) as f:
        meta = json.loads(str(f["meta"]))
        sent = {n.partition(":")[2]: f[n] for n in f.files if n.startswith("sent:")}
        received = {n.partition(":")[2]: f[n] for n in f.files if n.startswith("received:")}
        return InterceptedUpdate(
            server_round=meta["server_round"],
            node_id=meta["node_id"],
            declared=meta["declared"],
            sent_weight=f["sent_weight"],
            sent_bias=f["sent_bias"],
            weight=f["weight"],
            bias=f["bias"],
            audit=meta["audit"],
            sent_arrays=sent or None,
            arrays=received or None,
        )


def stored_updates(paths: Iterable[Path]) -> Iterator[InterceptedUpdate]:
    """The updates at ``paths`` that can be read; one that cannot (cut short by a kill before
    updates were written whole) is set aside as ``PATH.torn``, with a warning."""
    for path in paths:
        try:
            yield load_update(path)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            path.rename(path.with_name(f"{path.name}.torn"))
            log.warning("%s cannot be read (%s): set aside, its attacks are not resumed", path, err)
