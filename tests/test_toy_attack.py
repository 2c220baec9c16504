"""An attack added as a user adds one (tests/toys/toy_attack.py: its module, and its table in
the config) runs in the audit beside the built-in ones, on its own targets, with its own
settings, in the attack workers, and its table is validated like every other."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from attacks import ATTACKS
from fl_sim.audit.auditor import Auditor
from fl_sim.audit.context import AuditContext
from fl_sim.config import ConfigError, apply_overrides, parse_scenario
from fl_sim.config.schema import AuditSpec
from fl_sim.rundir import AUDIT, read_jsonl
from tests.test_audit import _data, _update

TOY = "tests.toys.toy_attack"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy attack registered for one test only (the registry as it was afterwards)."""
    monkeypatch.setattr(ATTACKS, "_plugins", dict(ATTACKS))
    monkeypatch.delitem(sys.modules, TOY, raising=False)
    importlib.import_module(TOY)


@pytest.mark.usefixtures("toy")
def test_a_new_attack_runs_on_its_targets_with_its_settings(tmp_path: Path) -> None:
    spec = AuditSpec(attacks=("spearpp", "toy"), toy={"rounds": [2], "scale": 2.0}, wait_s=120)
    auditor = Auditor(AuditContext(spec, tmp_path, 0, _data()))
    for server_round in (1, 2):
        auditor(_update(server_round, 0))
    auditor.finish()
    records = read_jsonl(tmp_path / AUDIT)
    assert sorted((r["round"], r["attack"]) for r in records) == [
        (1, "spearpp"), (2, "spearpp"), (2, "toy")
    ]  # fmt: skip
    (toy_record,) = (r for r in records if r["attack"] == "toy")
    assert toy_record["status"] == "partial" and toy_record["certified"] == 0


@pytest.mark.usefixtures("toy")
def test_its_table_is_read_and_checked_from_the_config() -> None:
    base = {"data": {"source": "photos"}, "clients": {"count": 2}, "rounds": 2}
    raw = apply_overrides(
        base, ['audit.attacks=["toy"]', "audit.toy.scale=3", "audit.toy.clients=[1]"]
    )
    audit = parse_scenario(raw).audit
    assert audit.table("toy").scale == 3.0  # type: ignore[attr-defined]
    assert audit.covers("toy", 1, 1) and not audit.covers("toy", 1, 0)
    bad = apply_overrides(base, ["audit.toy.size=3"])
    with pytest.raises(ConfigError, match=re.escape("unknown key 'audit.toy.size': allowed are")):
        parse_scenario(bad)


def test_without_it_its_table_is_an_unknown_key() -> None:
    raw = {"data": {"source": "photos"}, "audit": {"toy": {"scale": 2.0}}}
    with pytest.raises(ConfigError, match=re.escape("unknown key 'audit.toy': allowed are")):
        parse_scenario(raw)
