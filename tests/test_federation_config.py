"""The [federation] table: Flower's defaults, and errors that name the dotted key, the value
and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from fl_sim.config import ConfigError, parse_scenario
from fl_sim.config.federation import CentralDpSpec, SecAggSpec


def _federation(table: dict[str, Any], count: int = 3) -> Any:
    return parse_scenario({"clients": {"count": count}, "federation": table}).federation


def test_defaults_are_flowers() -> None:
    assert _federation({}).secagg is None and _federation({}).central_dp is None
    secagg = _federation({"secagg": {}}).secagg
    assert secagg == SecAggSpec(
        num_shares=3, reconstruction_threshold=2, clipping_range=8.0, quantization_range=2**22
    )
    assert secagg.max_weight == 1000.0
    dp = _federation({"central_dp": {"clipping": "server", "noise_multiplier": 2}}).central_dp
    assert dp == CentralDpSpec(noise_multiplier=2.0, clipping_norm=1.0, clipping="server")
    shares = _federation({"secagg": {"num_shares": 0.5, "reconstruction_threshold": 0.6}})
    assert shares.secagg.num_shares == 0.5


@pytest.mark.parametrize(("table", "count", "message"), [
    ({"secagg": {"num_shares": 2}}, 3,
     "federation.secagg.num_shares = 2: an integer must be > 2"),
    ({"secagg": {"num_shares": 1.5}}, 3, "federation.secagg.num_shares = 1.5: a float must lie"),
    ({"secagg": {"reconstruction_threshold": 1}}, 3,
     "federation.secagg.reconstruction_threshold = 1: an integer must be >= 2"),
    ({"secagg": {"num_shares": 3, "reconstruction_threshold": 3}}, 3,
     "federation.secagg = {'num_shares': 3, 'reconstruction_threshold': 3}: "
     "reconstruction_threshold = 3 must be < num_shares = 3"),
    ({"secagg": {"num_shares": 7, "reconstruction_threshold": 4}}, 3,
     "federation.secagg.reconstruction_threshold = 4: at most clients.count = 3"),
    ({"secagg": {}}, 1, "federation.secagg with clients.count = 1: SecAgg+ sums at least 2"),
    ({"secagg": {"clipping_range": "wide"}}, 3,
     "federation.secagg.clipping_range = 'wide': expected float"),
    ({"secagg": {"quantization_range": 2**33}}, 3, "federation.secagg.quantization_range = "),
    ({"secagg": {"masks": 1}}, 3,
     "unknown key 'federation.secagg.masks': allowed are clipping_range, max_weight, num_shares, "
     "quantization_range, reconstruction_threshold"),
    ({"central_dp": {"clipping": "both"}}, 3,
     "federation.central_dp.clipping = 'both': allowed are client, server"),
    ({"central_dp": {"clipping_norm": 0.0}}, 3,
     "federation.central_dp.clipping_norm = 0.0: must be > 0"),
    ({"central_dp": {"delta": 1.0}}, 3, "federation.central_dp.delta = 1.0: must be <"),
    ({"localdp": {}}, 3, "unknown key 'federation.localdp': allowed are central_dp, secagg"),
    ({"secagg": {}, "central_dp": {}}, 3,
     "federation = {'secagg': {}, 'central_dp': {}}: secagg and central_dp: choose one"),
    ({"secagg": 3}, 3, "federation.secagg = 3: Input should be a valid dictionary"),
])  # fmt: skip
def test_errors_name_the_key_the_value_and_what_is_allowed(
    table: dict[str, Any], count: int, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _federation(table, count)
    assert str(err.value).startswith(message), str(err.value)
