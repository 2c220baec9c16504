"""The [cluster] and [resources] tables: defaults keep a run local, bad values name their key."""

from __future__ import annotations

from typing import Any

import pytest

from fl_sim.config import ConfigError, parse_scenario


def test_defaults_keep_everything_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    s = parse_scenario({})
    assert s.cluster.attack_executor == "pool" and s.cluster.address == ""
    assert s.cluster.ray_address() == "local"  # never a cluster found by auto-detection
    assert (s.client_cpus, s.client_gpus, s.cluster.attack_cpus) == (1.0, 0.0, 0.0)


def test_address_from_the_config_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert parse_scenario({}).cluster.ray_address() == "10.0.0.5:6379"
    named = parse_scenario({"cluster": {"address": "ray://head:10001"}})
    assert named.cluster.ray_address() == "ray://head:10001"


def test_ray_settings_are_read() -> None:
    raw = {
        "resources": {"client_cpus": 2, "client_gpus": 0.25},
        "cluster": {
            "address": "auto",
            "attack_executor": "ray",
            "attack_gpus": 0.5,
            "attack_resource": "attack",
        },
    }
    s = parse_scenario(raw)
    assert (s.client_cpus, s.client_gpus) == (2.0, 0.25)
    assert s.cluster.attack_gpus == 0.5 and s.cluster.attack_resource == "attack"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"cluster": {"address": "head"}}, "cluster.address = 'head': expected host:port"),
        ({"cluster": {"attack_executor": "slurm"}}, "attack_executor = 'slurm': allowed are"),
        ({"cluster": {"attack_gpus": 1.5}}, "cluster.attack_gpus = 1.5: a share of one GPU"),
        ({"cluster": {"attack_cpus": -1}}, "cluster.attack_cpus = -1.0: must be"),
        ({"cluster": {"attack_resource": "a b"}}, "cluster.attack_resource = 'a b'"),
        ({"cluster": {"workers": 2}}, "unknown key 'cluster.workers'"),
        ({"cluster": {"attack_gpus": "one"}}, "cluster.attack_gpus = 'one': expected float"),
        ({"resources": {"client_cpus": 0}}, "resources.client_cpus = 0.0: must be > 0"),
        ({"resources": {"client_gpus": -0.5}}, "resources.client_gpus = -0.5: must be"),
        ({"resources": {"client_gpus": 2.5}}, "resources.client_gpus = 2.5: a share"),
    ],
)
def test_bad_values_name_their_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_scenario(raw)
