"""A server behaviour added as a user adds one (tests/toys/toy_behaviour.py: its module, and its
table in the config) is configured, validated and sent like the built-in ones."""

from __future__ import annotations

import importlib
import re
import sys

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from fl_sim.config import ConfigError, parse_scenario
from strategies import Tampering
from strategies.behaviours import BEHAVIOURS, behaviour_settings
from strategies.core import ServerCore
from tests.test_behaviours import LAYER, NO_NODES, _honest_layer, _Inner, _inputs

TOY = "tests.toys.toy_behaviour"


@pytest.fixture(autouse=True)
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy behaviour registered for one test only (the registry as it was afterwards)."""
    monkeypatch.setattr(BEHAVIOURS, "_plugins", dict(BEHAVIOURS))
    monkeypatch.delitem(sys.modules, TOY, raising=False)
    importlib.import_module(TOY)


def test_its_table_is_read_and_checked_from_the_config() -> None:
    base = {"data": {"source": "photos"}, "clients": {"count": 2}}
    server = parse_scenario({**base, "server": {"behaviour": "toy", "toy": {"factor": 3}}}).server
    assert server.behaviour.behaviour == "toy" and server.behaviour.factor == 3.0  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=re.escape("server.toy.factor = 'x': expected float")):
        parse_scenario({**base, "server": {"behaviour": "toy", "toy": {"factor": "x"}}})


def test_the_wrapper_sends_its_layer() -> None:
    weight, bias = _honest_layer()
    inner = _Inner()
    core = ServerCore(behaviour_settings("toy", factor=3.0), _inputs(50, 1), seed=0)
    wrapper = Tampering(inner, core, LAYER)  # type: ignore[arg-type]
    honest = {LAYER[0]: weight, LAYER[1]: bias}
    wrapper.configure_train(
        1, ArrayRecord({k: Array(v) for k, v in honest.items()}), ConfigRecord(), NO_NODES
    )  # type: ignore[arg-type]
    assert np.array_equal(inner.sent[LAYER[0]].numpy(), 3.0 * weight)
    assert np.array_equal(inner.sent[LAYER[1]].numpy(), 3.0 * bias)
