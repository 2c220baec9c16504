"""A client's round as the ClientApp runs it: the reply's contents and epsilon across rounds."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from opacus.accountants import RDPAccountant

from clients import PrivacyLedger
from clients.reply import (
    ARRAYS,
    AUDIT,
    CLIENT,
    CLIENT_ERROR,
    DIVERGED,
    METRICS,
    NUM_EXAMPLES,
    PARTITION_ID,
    REASON,
    SAMPLE_IDS,
    SERVER_ROUND,
    STATUS,
)
from fl_sim.apps.client import client_reply, local_round
from fl_sim.apps.server import initial_arrays
from fl_sim.config import Scenario, parse_scenario
from fl_sim.data.federated import federated_data

SCENARIO = parse_scenario(
    {
        "rounds": 3,
        "data": {"source": "photos", "samples_per_client": 30, "test_size": 40},
        "model": {"width": 32, "depth": 3},
        "clients": {
            "count": 3,
            "batch_size": 12,
            "1": {"defence": "fedavg", "epochs": 2, "mini_batch": 4},
            "2": {"defence": "dp", "clip": 1.0, "noise_multiplier": 1.1, "mini_batch": 4},
        },
    }
)


def _start(scenario: Scenario) -> ArrayRecord:
    """The scenario's global model at round 0, shaped by its data."""
    data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
    return initial_arrays(scenario, data.description)


def _message(server_round: int) -> RecordDict:
    return RecordDict(
        {"arrays": _start(SCENARIO), "config": ConfigRecord({"server-round": server_round})}
    )


def test_reply_carries_update_metrics_declaration_and_audit_ids() -> None:
    reply = local_round(SCENARIO, _message(1), 1, RecordDict())
    declared = reply["client"]
    assert isinstance(declared, ConfigRecord)
    assert declared["defence"] == "fedavg" and declared["steps"] == 2 * math.ceil(12 / 4)
    assert declared[STATUS] == "ok"
    assert reply["metrics"]["num-examples"] == 12  # type: ignore[index]
    ids = reply["audit"]["sample-ids"]  # type: ignore[index]
    data = federated_data(SCENARIO.data, 3, SCENARIO.seed)
    assert len(ids) == 12 and set(ids) <= set(data.partitions[1].tolist())  # type: ignore[arg-type]
    arrays = reply["arrays"]
    assert isinstance(arrays, ArrayRecord)
    sent = _start(SCENARIO).to_torch_state_dict()
    got = arrays.to_torch_state_dict()
    assert not torch.equal(sent["1.weight"], got["1.weight"])


def test_epsilon_grows_and_matches_opacus() -> None:
    state = RecordDict()
    eps = []
    for r in (1, 2, 3):
        declared = local_round(SCENARIO, _message(r), 2, state)["client"]
        assert isinstance(declared, ConfigRecord)
        eps.append(float(declared["epsilon"]))  # type: ignore[arg-type]
    assert eps[0] < eps[1] < eps[2]
    accountant = RDPAccountant()
    for _ in range(3 * 3):  # 3 rounds x ceil(12 / 4) steps at sample rate 4 / 12
        accountant.step(noise_multiplier=1.1, sample_rate=4 / 12)
    assert eps[2] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)


def test_ledger_round_trip() -> None:
    ledger = PrivacyLedger().spend(1.0, 0.5, 4).spend(0.8, 0.25, 2)
    again = PrivacyLedger.from_lists(**ledger.as_lists())  # type: ignore[arg-type]
    assert again == ledger and again.epsilon(1e-5) == ledger.epsilon(1e-5)
    assert PrivacyLedger().spend(0.0, 1.0, 1).epsilon(1e-5) == math.inf


def test_a_diverging_client_replies_failed_and_spends_no_privacy() -> None:
    scenario = parse_scenario(
        {
            "data": {"source": "photos", "samples_per_client": 30, "test_size": 40},
            "model": {"width": 32, "depth": 3},
            "clients": {"count": 1, "batch_size": 12, "defence": "dp", "lr": 1e4},
        }
    )
    state = RecordDict()
    message = RecordDict({"arrays": _start(scenario), "config": ConfigRecord({SERVER_ROUND: 4})})
    reply = client_reply(scenario, message, 0, state)
    assert ARRAYS not in reply and reply[METRICS][NUM_EXAMPLES] == 0  # type: ignore[index]
    declared = reply[CLIENT]
    assert isinstance(declared, ConfigRecord)
    assert declared[STATUS] == DIVERGED and "loss on its batch went from" in str(declared[REASON])
    assert declared[SERVER_ROUND] == 4 and declared[PARTITION_ID] == 0 and "epsilon" not in declared
    assert len(reply[AUDIT][SAMPLE_IDS]) == 12  # type: ignore[index, arg-type]
    assert "privacy-ledger" not in state  # no update released: nothing spent


def test_a_client_whose_round_raises_replies_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("out of memory")

    monkeypatch.setattr("fl_sim.apps.client.train_locally", broken)
    reply = client_reply(SCENARIO, _message(2), 1, RecordDict())
    declared = reply[CLIENT]
    assert isinstance(declared, ConfigRecord) and ARRAYS not in reply
    assert (declared[STATUS], declared[REASON]) == (CLIENT_ERROR, "RuntimeError: out of memory")
    assert (declared[SERVER_ROUND], declared[PARTITION_ID]) == (2, 1)
    no_arrays = client_reply(SCENARIO, RecordDict({"config": ConfigRecord()}), 0, RecordDict())
    declared = no_arrays[CLIENT]
    assert isinstance(declared, ConfigRecord) and declared[STATUS] == CLIENT_ERROR
    assert "no integer config['server-round']" in str(declared[REASON])
    assert SERVER_ROUND not in declared
