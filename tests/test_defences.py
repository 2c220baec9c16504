"""The defence registry and its update mods, each against a direct computation: quantisation
unbiased and on its levels, local DP exactly Flower's LocalDpMod and composed across rounds,
every new setting validated up front, and a short federation with one client per update mod."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp.mod import LocalDpMod

from clients.defences import (
    DEFENCES,
    DefenceSettings,
    Disclosure,
    TrainingDefence,
    UpdateMod,
    training_defences,
    update_mods,
)
from clients.defences.base import DEFENCE, EPSILON, LR, STEPS, UPDATE_MODS, defence_label
from clients.defences.local_dp import (
    LocalDp,
    LocalDpSettings,
    gaussian_std,
    seeded_numpy,
)
from clients.defences.quantize import BITS, Quantize, QuantizeSettings, quantize
from clients.reply import ARRAYS, CLIENT, CONFIG, SERVER_ROUND, STATUS
from fl_sim.config import ConfigError, parse_scenario
from fl_sim.run import run_scenario

KEYS = ("1.weight", "1.bias")
# Messages made outside a running Flower app need an identity.
pytestmark = pytest.mark.usefixtures("flower_identity")


def arrays_of(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"1.weight": rng.standard_normal((6, 5)), "1.bias": rng.standard_normal(6)}


def fresh_context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def reply_through(
    mod: Any,
    sent: dict[str, np.ndarray],
    received: dict[str, np.ndarray] | None,
    context: Context | None = None,
) -> Message:
    """``mod`` around a handler that replies ``received`` (``None``: a failed reply)."""
    msg = Message(
        RecordDict(
            {
                ARRAYS: ArrayRecord({k: Array(v) for k, v in sent.items()}),
                CONFIG: ConfigRecord({SERVER_ROUND: 1}),
            }
        ),
        dst_node_id=1,
        message_type="train",
    )
    declared = ConfigRecord({DEFENCE: "fedsgd", LR: 0.5, STEPS: 1, STATUS: "ok"})

    def handler(m: Message, c: Context) -> Message:
        content = RecordDict({CLIENT: ConfigRecord(dict(declared))})
        if received is not None:
            content[ARRAYS] = ArrayRecord({k: Array(v.copy()) for k, v in received.items()})
        return Message(content, reply_to=m)

    return mod(msg, context or fresh_context(), handler)  # type: ignore[no-any-return]


def update_of(reply: Message, sent: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    arrays = reply.content[ARRAYS]
    assert isinstance(arrays, ArrayRecord)
    return {k: arrays[k].numpy() - sent[k] for k in sent}


@pytest.mark.parametrize("name", sorted(DEFENCES))
def test_every_registered_defence_has_settings_a_declaration_and_a_knowledge_rule(
    name: str,
) -> None:
    defence = DEFENCES[name]
    settings = defence.Settings()  # every setting has a default
    assert isinstance(settings, DefenceSettings) and settings.defence == name == defence.name
    assert defence.Settings.model_config.get("frozen") and (
        defence.Settings.model_config.get("extra") == "forbid"
    )
    with pytest.raises(AttributeError):
        settings.defence_setting = 1  # type: ignore[attr-defined]
    assert settings.model_dump()["defence"] == name
    rng = np.random.default_rng(0)
    sent = arrays_of(rng)
    if isinstance(defence, TrainingDefence):
        declared: dict[str, Any] = {DEFENCE: name, LR: 0.1, STEPS: 1}
        declared |= defence.declare(settings, 10)
        ConfigRecord(declared)  # every declared value fits a Flower record
    else:
        assert isinstance(defence, UpdateMod)
        received = {k: v + 0.01 * rng.standard_normal(v.shape) for k, v in sent.items()}
        reply = reply_through(defence.mod(settings, seed=3), sent, received)
        record = reply.content[CLIENT]
        assert isinstance(record, ConfigRecord) and record[UPDATE_MODS] == [name]
        declared = dict(record)
    told = defence.disclose(declared, 0.01 * rng.standard_normal((6, 5)))
    assert isinstance(told, Disclosure)
    assert told.noise_std is None or told.noise_std >= 0


def test_update_mods_apply_in_their_declared_order() -> None:
    orders = [mod.order for mod in update_mods().values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert list(training_defences()) == ["fedsgd", "fedavg", "dp"]
    raw = {
        "clients": {
            "count": 1,
            # named in the opposite order: applied in the registry's, local DP first
            "0": {"quantize": {"bits": 4}, "local_dp": {"epsilon": 0.5}},
        }
    }
    spec = parse_scenario(raw).clients[0]
    assert spec.defences == ("fedsgd", "local_dp", "quantize")


def test_failed_replies_pass_every_mod_untouched() -> None:
    sent = arrays_of(np.random.default_rng(1))
    for mod in update_mods().values():
        context = fresh_context()
        reply = reply_through(mod.mod(mod.Settings(), seed=0), sent, None, context)
        assert ARRAYS not in reply.content and UPDATE_MODS not in reply.content[CLIENT]  # type: ignore[operator]
        assert not context.state  # nothing released, nothing spent


@pytest.mark.parametrize("bits", [1, 3, 8])
def test_quantize_is_unbiased_and_on_its_levels(bits: int) -> None:
    rng = np.random.default_rng(bits)
    u = rng.standard_normal((20, 10))
    draws = np.stack([quantize(u, bits, rng) for _ in range(4000)])
    low, high = u.min(), u.max()
    step = (high - low) / (2**bits - 1)
    levels = (draws - low) / step
    assert np.allclose(levels, np.round(levels), atol=1e-9)  # every value on a level
    assert levels.min() > -1e-9 and levels.max() < 2**bits - 1 + 1e-9
    # Unbiased: the mean of the draws within 5 standard errors of the entry (error <= step/2).
    assert np.all(np.abs(draws.mean(axis=0) - u) < 5 * (step / 2) / math.sqrt(len(draws)))
    assert draws.min() == pytest.approx(low) and draws.max() == pytest.approx(high)


def test_quantize_mod_and_the_noise_it_discloses() -> None:
    rng = np.random.default_rng(4)
    sent = arrays_of(rng)
    # A uniform update: its entries sit at uniform places between levels.
    received = {k: v + rng.uniform(-1, 1, v.shape) for k, v in sent.items()}
    settings = QuantizeSettings(bits=3)
    errors = []
    for seed in range(300):
        reply = reply_through(Quantize().mod(settings, seed), sent, received)
        update = update_of(reply, sent)
        truth = received["1.weight"] - sent["1.weight"]
        errors.append(update["1.weight"] - truth)
    record = reply.content[CLIENT]
    assert isinstance(record, ConfigRecord) and record[BITS] == 3
    told = Quantize().disclose(dict(record), truth)
    # In gradient units: the empirical rounding error's std divided by the declared lr.
    empirical = float(np.std(errors)) / 0.5
    assert told.adds_noise and told.noise_std == pytest.approx(empirical, rel=0.1)


def test_local_dp_is_flowers_mod_seeded_and_composed_across_rounds() -> None:
    rng = np.random.default_rng(5)
    sent = arrays_of(rng)
    received = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in sent.items()}
    settings = LocalDpSettings(clipping_norm=0.5, sensitivity=0.1, epsilon=0.8, delta=1e-4)
    context = fresh_context()
    ours = reply_through(LocalDp().mod(settings, seed=7), sent, received, context)
    with seeded_numpy(7 + LocalDp.order):
        flower = LocalDpMod(0.5, 0.1, 0.8, 1e-4)
        theirs = reply_through(flower, sent, received)
    got, want = update_of(ours, sent), update_of(theirs, sent)
    assert all(np.array_equal(got[k], want[k]) for k in KEYS)
    record = ours.content[CLIENT]
    assert isinstance(record, ConfigRecord)
    assert record[EPSILON] == pytest.approx(0.8) and record[UPDATE_MODS] == ["local_dp"]
    for _ in range(2):  # two more rounds: basic composition
        record = reply_through(LocalDp().mod(settings, 8), sent, received, context).content[CLIENT]  # type: ignore[assignment]
    assert isinstance(record, ConfigRecord)
    assert record["local-dp-epsilon-total"] == pytest.approx(3 * 0.8)
    assert record["local-dp-delta-total"] == pytest.approx(3e-4)
    assert record[EPSILON] == pytest.approx(2.4) and record["local-dp-epsilon"] == 0.8


def test_local_dp_noise_has_the_std_its_knowledge_rule_gives() -> None:
    sent = {"1.weight": np.zeros((200, 100)), "1.bias": np.zeros(200)}
    settings = LocalDpSettings(clipping_norm=1.0, sensitivity=0.01, epsilon=0.5, delta=1e-5)
    # An update far below the noise (Flower's clipping divides by the update's norm: never 0).
    tiny = {k: v + 1e-12 for k, v in sent.items()}
    reply = reply_through(LocalDp().mod(settings, seed=1), sent, tiny)
    noise = update_of(reply, sent)["1.weight"]
    expected = 0.01 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5
    assert gaussian_std(0.01, 0.5, 1e-5) == pytest.approx(expected)
    assert float(noise.std()) == pytest.approx(expected, rel=0.03)
    record = reply.content[CLIENT]
    assert isinstance(record, ConfigRecord)
    told = LocalDp().disclose(dict(record), noise)
    assert told.noise_std == pytest.approx(expected / 0.5) and told.next_layer  # lr 0.5, 1 step


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"local_dp": {"epsilon": 0}}, "clients.0.local_dp.epsilon = 0.0: must be > 0"),
        ({"local_dp": {"delta": 1}}, "clients.0.local_dp.delta = 1.0: must be in (0, 1)"),
        ({"local_dp": {"clipping_norm": -1}}, "clients.0.local_dp.clipping_norm = -1.0: must"),
        ({"local_dp": {"sensitivity": "x"}}, "local_dp.sensitivity = 'x': expected float"),
        ({"local_dp": {"eps": 1}}, "unknown key 'clients.0.local_dp.eps': allowed are clip"),
        ({"quantize": {"bits": 0}}, "clients.0.quantize.bits = 0: must be >= 1"),
        ({"quantize": {"bits": 64}}, "clients.0.quantize.bits = 64: must be <= 32"),
        ({"quantize": {"bits": 2.5}}, "clients.0.quantize.bits = 2.5: expected int"),
        ({"quantize": 8}, "clients.0.quantize = 8: expected a table of its settings"),
        ({"quantise": {"bits": 8}}, "unknown key 'clients.0.quantise': allowed are batch_size"),
    ],
)
def test_new_settings_are_validated_up_front(override: dict[str, Any], message: str) -> None:
    raw = {"clients": {"count": 1, "0": override}}
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_scenario(raw)


def test_a_short_federation_with_one_client_per_update_mod(tmp_path: Path) -> None:
    """Every registered update mod on a client of its own, in one run: its records carry its
    defence, the federation trains, and local DP's epsilon adds up over the rounds."""
    mods = list(update_mods())
    tables: dict[str, Any] = {str(i + 1): {m: {}} for i, m in enumerate(mods)}
    tables[str(mods.index("local_dp") + 1)] = {
        "local_dp": {"clipping_norm": 10.0, "sensitivity": 1e-3, "epsilon": 0.5}
    }
    raw: dict[str, Any] = {
        "name": "mods",
        "rounds": 2,
        "data": {"source": "photos", "samples_per_client": 16, "test_size": 40},
        "model": {"width": 40, "depth": 3},
        "clients": {"count": len(mods) + 1, "batch_size": 8, "lr": 0.1, **tables},
        "audit": {"spearpp": {"starts": 200, "steps": 200, "max_passes": 2, "time_budget_s": 5.0}},
    }
    run_dir = run_scenario(parse_scenario(raw), raw, tmp_path / "run")
    records = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    defences = {(r["round"], r["client"]): r["defence"] for r in records}
    assert defences == {
        (r, c): "fedsgd" if c == 0 else f"fedsgd+{mods[c - 1]}"
        for r in (1, 2)
        for c in range(len(mods) + 1)
    }
    # Top-k breaks the gradient's low rank: among the neurons that carry a gradient it can be
    # full rank, and the attack says so.
    assert all(
        r["status"] in ("exact", "partial", "failed")
        or (
            r["defence"] == "fedsgd+topk" and r["status"] == "refused" and "low-rank" in r["reason"]
        )
        for r in records
    ), records
    local = sorted(
        (r for r in records if r["defence"] == "fedsgd+local_dp"), key=lambda r: r["round"]
    )
    assert [r["epsilon"] for r in local] == pytest.approx([0.5, 1.0])
    assert all(r["knowledge"]["noise"] == "declared" for r in local)
    report = (run_dir / "report.html").read_text()
    assert all(f"fedsgd+{m}" in report for m in mods)


def test_a_client_that_declares_no_defence_is_labelled_undeclared() -> None:
    assert defence_label({}) == "undeclared"  # a Flower app of one's own: said nothing
    assert defence_label({DEFENCE: "fedsgd", UPDATE_MODS: ["topk"]}) == "fedsgd+topk"
