"""Scenario parsing, --set overrides, and every rejection path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fl_sim.config import ConfigError, apply_overrides, load_scenario, parse_scenario

BASE: dict[str, Any] = {
    "name": "t",
    "rounds": 2,
    "data": {"samples_per_client": 30, "test_size": 50},
    "clients": {
        "count": 5,
        "batch_size": 10,
        "lr": 0.02,
        "1": {"defence": "fedavg", "epochs": 3, "mini_batch": 5},
        "2-4": {"defence": "dp", "clip": 2.0, "noise_multiplier": 1e-4},
    },
}


def test_groups_and_single_clients() -> None:
    s = parse_scenario(BASE)
    kinds = [c.training.defence for c in s.clients]
    assert kinds == ["fedsgd", "fedavg", "dp", "dp", "dp"]
    assert s.clients[1].training.epochs == 3 and s.clients[1].training.lr == 0.02
    assert s.clients[3].training.noise_multiplier == 1e-4
    assert all(c.batch_size == 10 for c in s.clients)


def test_overrides_reach_any_key() -> None:
    raw = apply_overrides(
        BASE,
        [
            "clients.3.noise_multiplier=1.0",
            "clients.0.defence=dp",
            "rounds=4",
            "data.source=photos",
        ],
    )
    s = parse_scenario(raw)
    assert s.rounds == 4 and s.data.source == "photos"
    assert s.clients[0].training.defence == "dp"
    assert s.clients[3].training.noise_multiplier == 1.0
    assert s.clients[2].training.noise_multiplier == 1e-4
    assert BASE["rounds"] == 2  # the input is not mutated


def test_frozen() -> None:
    s = parse_scenario(BASE)
    with pytest.raises(AttributeError):
        s.rounds = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["roundz=3"], "unknown key 'roundz'"),
        (["data.sorce=x"], "unknown key 'data.sorce'"),
        (["data.source=imagenet"], "data.source = 'imagenet': allowed are auto, cifar10, photos"),
        (["data.partition=skew"], "allowed are iid, dirichlet"),
        (["rounds=0"], "rounds = 0: must be >= 1"),
        (["rounds=1.5"], "rounds = 1.5: expected int"),
        (["clients.count=0"], "clients.count = 0"),
        (["clients.7.lr=0.1"], "clients.7: ids must lie in 0..4"),
        (["clients.x.lr=0.1"], "a client table is named by an id or a range"),
        (["clients.1.defence=secure"], "allowed are fedsgd, fedavg, dp"),
        (["clients.1.speed=3"], "unknown key 'clients.1.speed'"),
        (["clients.2.clip=-1"], "need clip > 0"),
        (["clients.batch_size=40"], "batch_size = 40 exceeds data.samples_per_client = 30"),
        (["clients.delta=2"], "delta = 2.0: must be in (0, 1)"),
        (["model.depth=1"], "model.depth = 1: must be >= 2"),
        (["data.alpha=0"], "data.alpha = 0.0: must be > 0"),
        (["clients.0.defence=fedsgd", "clients.0.epochs=2"], None),
        (["noequals"], "expected KEY=VALUE"),
    ],
)
def test_rejections_name_key_value_and_allowed(overrides: list[str], message: str | None) -> None:
    if message is None:  # fedsgd ignores epochs given to a group that becomes fedsgd: accepted
        parse_scenario(apply_overrides(BASE, overrides))
        return
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_scenario(apply_overrides(BASE, overrides))


def test_shipped_scenarios_parse() -> None:
    configs = Path(__file__).resolve().parents[1] / "configs"
    files = sorted(configs.glob("*.toml"))
    assert files, "no scenario files shipped"
    for path in files:
        scenario, _ = load_scenario(path)
        assert scenario.clients


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_scenario(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(bad)
