"""The two readers of outside input, tried with generated bad input (hypothesis): the update
file of ``fl-sim attack`` and a scenario with ``--set`` overrides. Every case ends in a valid
object or the reader's own error naming what is wrong, never another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_sim.config import ConfigError, apply_overrides, parse_scenario
from fl_sim.saved_update import UpdateFileError, read_update
from fl_sim.saved_update.update_file import KEYS

CASES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.just(0.0)
)


@st.composite
def _arrays(draw: st.DrawFn) -> np.ndarray:
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    dtype = draw(st.sampled_from(["float64", "float32", "int64", "bool", "complex128", "<U3"]))
    values = draw(st.lists(_VALUES, min_size=1, max_size=1))[0]
    if dtype == "<U3":
        return np.full(shape, "x", dtype=dtype)
    with np.errstate(invalid="ignore", over="ignore"):  # nan and inf cast to ints, on purpose
        return np.full(shape, values).astype(dtype)


@CASES
@given(
    st.dictionaries(st.sampled_from([*KEYS, "junk", "weights"]), _arrays(), max_size=8),
    st.sampled_from(["npz", "bytes", "empty"]),
    st.binary(max_size=64),
)
def test_update_files(arrays: dict[str, np.ndarray], kind: str, noise: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "update.npz"
        if kind == "npz":
            np.savez(path, **arrays)
        else:
            path.write_bytes(noise if kind == "bytes" else b"")
        try:
            read_update(path)
        except UpdateFileError as err:
            assert str(err) and "\n" not in str(err)


_KEYS = [
    "rounds", "seed", "name", "data.source", "data.samples_per_client", "data.partition",
    "data.alpha", "model.width", "model.depth", "model.dtype", "clients.count",
    "clients.batch_size", "clients.0.defence", "clients.1.epochs", "clients.lr", "clients.clip",
    "clients.topk.share", "clients.1.quantize.bits", "server.behaviour", "server.trap.batch_size",
    "audit.attacks", "audit.rounds", "audit.clients", "audit.spearpp.starts",
    "audit.spearpp.time_budget_s", "audit.inversion.losses", "audit.starts", "federation.secagg",
    "cluster.address", "resources.client_cpus", "x", "clients.9.defence", "audit.toy.x",
]  # fmt: skip
_LITERALS = [
    "1", "-1", "0", "1.5", "nan", "inf", "true", '"dp"', '"fedavg"', "[1, 2]", '["spearpp"]',
    "[]", "{}", '"x"', "[", "{a=1}", "1e999", '""',
]  # fmt: skip
_OVERRIDE = st.tuples(
    st.one_of(st.sampled_from(_KEYS), st.text(max_size=8)),
    st.one_of(st.sampled_from(_LITERALS), st.text(max_size=12)),
)
BASE: dict[str, Any] = {"data": {"source": "photos"}, "clients": {"count": 2}, "rounds": 2}


@CASES
@given(st.lists(_OVERRIDE, max_size=4))
def test_scenario_overrides(overrides: list[tuple[str, str]]) -> None:
    try:
        parse_scenario(apply_overrides(BASE, [f"{k}={v}" for k, v in overrides]))
    except ConfigError as err:
        assert str(err)
