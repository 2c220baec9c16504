"""The ClientApp: each simulated client trains with its own defence and replies with its update.

A reply holds the updated weights (``arrays``), ``num-examples`` and the training loss
(``metrics``, averaged by FedAvg), the client's declared settings and epsilon (``client``, a
ConfigRecord, never averaged), and, in simulation only, which samples it trained on (``audit``):
ground truth for the judge, never read by the attack.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    ConfigRecordValues,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from clients import PrivacyLedger, train_locally
from fl_sim.config.schema import Scenario
from fl_sim.data.federated import federated_data

_LEDGER_KEY = "privacy-ledger"


def round_seed(scenario: Scenario, client: int, server_round: int) -> int:
    """Seed of one client's round: its batch draw and any randomness of its training."""
    return (scenario.seed * 1_000_003 + client * 10_007 + server_round) % 2**63


def local_round(
    scenario: Scenario, content: RecordDict, client: int, state: RecordDict
) -> RecordDict:
    """One client's round: draw its batch, train from the global weights, build the reply.

    Parameters
    ----------
    scenario
        The run.
    content
        The server's message: ``arrays`` (global weights) and ``config`` (``server-round``).
    client
        The client's partition id.
    state
        The client's persistent state (keeps the DP ledger across rounds).
    """
    spec = scenario.clients[client]
    server_round = int(content["config"]["server-round"])  # type: ignore[arg-type]
    data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
    seed = round_seed(scenario, client, server_round)
    local = data.partitions[client]
    picked = np.sort(np.random.default_rng(seed).choice(local, spec.batch_size, replace=False))
    x, y = data.tensors(picked)
    x = x.to(getattr(torch, scenario.model.dtype))
    model = scenario.model.build()
    arrays = content["arrays"]
    assert isinstance(arrays, ArrayRecord)
    model.load_state_dict(arrays.to_torch_state_dict())
    training = spec.training
    result = train_locally(model, x, y, training, torch.Generator().manual_seed(seed))
    declared: dict[str, ConfigRecordValues] = {
        "server-round": server_round,
        "partition-id": client,
        "defence": training.defence,
        "lr": training.lr,
        "epochs": training.epochs,
        "mini-batch": training.mini_batch or spec.batch_size,
        "batch-size": spec.batch_size,
        "steps": result.steps,
        "train-loss": result.loss,
    }
    if training.defence == "dp":
        ledger = PrivacyLedger()
        if _LEDGER_KEY in state:
            kept = state[_LEDGER_KEY]
            assert isinstance(kept, ConfigRecord)
            ledger = PrivacyLedger.from_lists(kept["noise"], kept["rate"], kept["steps"])  # type: ignore[arg-type]
        ledger = ledger.spend(training.noise_multiplier, result.sample_rate, result.steps)
        state[_LEDGER_KEY] = ConfigRecord(ledger.as_lists())  # type: ignore[arg-type]
        declared |= {
            "clip": training.clip,
            "noise-multiplier": training.noise_multiplier,
            "noise-std": result.noise_std,
            "poisson": training.poisson,
            "delta": spec.delta,
            "epsilon": ledger.epsilon(spec.delta),
        }
    return RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord({"num-examples": spec.batch_size, "train-loss": result.loss}),
            "client": ConfigRecord(declared),
            "audit": ConfigRecord({"sample-ids": [int(i) for i in picked]}),
        }
    )


def make_client_app(scenario: Scenario) -> ClientApp:
    """A ClientApp whose clients follow ``scenario`` (their partition id picks their spec)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        client = int(context.node_config["partition-id"])
        return Message(local_round(scenario, msg.content, client, context.state), reply_to=msg)

    return app
