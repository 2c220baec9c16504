"""Scenario parsing, --set overrides, and every rejection path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from attacks.plugins.inversion import InversionTable
from attacks.plugins.spearpp import SpearTable
from fl_sim.config import ConfigError, apply_overrides, load_scenario, parse_scenario
from fl_sim.config.upgrade import upgraded_scenario

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
        (
            ["data.source=imagenet"],
            "data.source = 'imagenet': allowed are auto, cifar10, photos, imagefolder, "
            "breast_cancer",
        ),
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
        (["data.mirror=true"], "data.mirror = true with data.source = 'auto': only 'cifar10'"),
        (["data.source=cifar10", "data.mirror=true"], None),
        (["clients.0.defence=fedsgd", "clients.0.epochs=2"], None),
        (["noequals"], "expected KEY=VALUE"),
        (
            ['audit.attacks=["dlg"]'],
            "audit.attacks = ['dlg']: allowed are analytic, inversion, spearpp",
        ),
        (['audit.attacks=["spearpp", "spearpp"]'], "each at most once"),
        (
            ['audit.inversion.losses=["l1"]'],
            "audit.inversion.losses = ['l1']: allowed are l2, cosine",
        ),
        (["audit.inversion.iterations=0"], "audit.inversion.iterations = 0: must be >= 1"),
        (["audit.inversion.speed=3"], "unknown key 'audit.inversion.speed'"),
        (["audit.inversion.dtype=half"], "audit.inversion.dtype = 'half': allowed are float32"),
        (["audit.inversion.device=tpu"], "audit.inversion.device = 'tpu': allowed are auto"),
        (["audit.spearpp.clients=[9]"], "audit.spearpp.clients = [9]: [9] outside 0..4"),
        (["audit.spearpp.starts=0"], "audit.spearpp.starts = 0: must be >= 1"),
        (["audit.spearpp.budget_clock=gpu"], "audit.spearpp.budget_clock = 'gpu': allowed are cpu"),
        (["audit.spearpp.speed=3"], "unknown key 'audit.spearpp.speed': allowed are budget_clock,"),
        (["audit.analytic.rounds=[9]"], "audit.analytic.rounds = [9]: [9] outside 1..2"),
        # SPEAR++'s budget had its place in [audit] before each attack had a table.
        (["audit.starts=3"], "audit.starts = 3: moved to [audit.spearpp] starts"),
        (["audit.time_budget_s=3.0"], "audit.time_budget_s = 3.0: moved to [audit.spearpp]"),
        (["audit.rounds=[3]"], "audit.rounds = [3]: [3] outside 1..2"),
        (["audit.proxy_tol=0"], "audit.proxy_tol = 0.0: must be > 0"),
        (["audit.proxies=1"], "audit.proxies = 1: expected bool"),
        (["audit.attack=spearpp"], "unknown key 'audit.attack': allowed are analytic, attacks,"),
    ],
)
def test_rejections_name_key_value_and_allowed(overrides: list[str], message: str | None) -> None:
    # Accepted: fedsgd ignores epochs given to a group that becomes fedsgd; CIFAR-10 mirrored.
    if message is None:
        parse_scenario(apply_overrides(BASE, overrides))
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_scenario(apply_overrides(BASE, overrides))


def test_attacks_and_their_targets() -> None:
    s = parse_scenario(BASE)
    assert s.audit.attacks == ("spearpp",) and not s.audit.proxies  # SPEAR++ alone by default
    raw = apply_overrides(
        BASE,
        [
            'audit.attacks=["spearpp", "inversion"]',
            "audit.proxies=true",
            "audit.inversion.clients=[1, 3]",
            'audit.inversion.losses=["l2", "cosine"]',
            "audit.inversion.iterations=50",
            "audit.spearpp.rounds=[2]",
            "audit.spearpp.starts=300",
        ],
    )
    audit = parse_scenario(raw).audit
    assert audit.attacks == ("spearpp", "inversion") and audit.proxies
    inversion = audit.table("inversion")
    assert isinstance(inversion, InversionTable)
    assert inversion.losses == ("l2", "cosine") and inversion.iterations == 50
    assert audit.covers("inversion", 1, 3) and not audit.covers("inversion", 1, 0)
    assert audit.covers("spearpp", 2, 0) and not audit.covers("spearpp", 1, 0)
    assert isinstance(audit.table("spearpp"), SpearTable) and audit.table("spearpp").starts == 300
    # Written out and read back as a stored run's scenario is: the same tables.
    dumped = audit.model_dump(mode="json")
    assert dumped["spearpp"]["starts"] == 300 and dumped["inversion"]["iterations"] == 50
    assert type(audit).model_validate(dumped) == audit


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


def test_stored_runs_of_the_flat_audit_layout_are_read_in_todays() -> None:
    old = {"rounds": 2, "audit": {"starts": 3, "time_budget_s": 5.0, "spearpp": {"rounds": [1]}}}
    new = upgraded_scenario(old)
    assert new["audit"] == {"spearpp": {"rounds": [1], "starts": 3, "time_budget_s": 5.0}}
    assert old["audit"]["starts"] == 3  # the stored dict is left as it was
    audit = parse_scenario(apply_overrides(BASE, [])).audit
    spearpp = type(audit).model_validate(new["audit"]).table("spearpp")
    assert isinstance(spearpp, SpearTable) and spearpp.rounds == (1,) and spearpp.starts == 3
