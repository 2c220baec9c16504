"""Server behaviours: the first layers they send (against brute-force counts), the wrapper that
sends them and keeps the global model honest, the clients' check, the analytic attack on trap
weights, and short federations under each behaviour."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from attacks.analytic import AnalyticConfig, run_analytic
from attacks.spearpp.inputs import observe_layer
from clients.reply import CLIENT, PARTITION_ID
from clients.tamper_check import check_first_layer
from fl_sim.config import ConfigError, parse_scenario
from fl_sim.run import run_scenario
from strategies import Tampering
from strategies.behaviours import BEHAVIOURS, behaviour_settings
from strategies.core import ServerCore

LAYER = ("1.weight", "1.bias")
N_IN, WIDTH = 30, 400


@pytest.fixture(autouse=True)
def _identity() -> Iterator[None]:
    """Messages made outside a running app need an identity; restored afterwards."""
    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before


def _inputs(n: int, seed: int) -> np.ndarray:
    """Samples of one distribution, as a normalised first layer takes them."""
    return np.random.default_rng(seed).standard_normal((n, N_IN))


def _honest_layer(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    torch.manual_seed(seed)
    layer = nn.Linear(N_IN, WIDTH).double()
    return layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy()


def _sent(behaviour: str, **settings: Any) -> tuple[np.ndarray, np.ndarray]:
    weight, bias = _honest_layer()
    return BEHAVIOURS[behaviour].first_layer(
        weight, bias, _inputs(2000, 1), behaviour_settings(behaviour, **settings),
        np.random.default_rng(0),
    )  # fmt: skip


def _firing(weight: np.ndarray, bias: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per neuron, the share of samples of ``x`` it fires for, counted one by one."""
    return np.array(
        [[float(w @ s + b > 0) for s in x] for w, b in zip(weight, bias, strict=True)]
    ).mean(1)


def test_honest_sends_the_global_model_unchanged() -> None:
    weight, bias = _honest_layer()
    sent_w, sent_b = _sent("honest")
    assert np.array_equal(sent_w, weight) and np.array_equal(sent_b, bias)


def test_sparsify_keeps_the_weights_and_fires_each_neuron_for_its_share() -> None:
    weight, bias = _honest_layer()
    sent_w, sent_b = _sent("sparsify", share=0.1)
    assert np.array_equal(sent_w, weight) and not np.allclose(sent_b, bias)
    # On the server's own data to the sample; on fresh data of the same kind, close.
    assert np.abs(_firing(sent_w, sent_b, _inputs(2000, 1)) - 0.1).max() <= 1e-3
    assert abs(_firing(sent_w, sent_b, _inputs(500, 2)).mean() - 0.1) < 0.02


def test_trap_weights_keep_magnitudes_with_half_of_each_row_negative() -> None:
    weight, _ = _honest_layer()
    sent_w, sent_b = _sent("trap", batch_size=20, negative_scale=1.5)
    negative = sent_w < 0
    assert (negative.sum(axis=1) == N_IN // 2).all()
    assert np.allclose(np.abs(sent_w), np.abs(weight) * np.where(negative, 1.5, 1.0))
    assert abs(_firing(sent_w, sent_b, _inputs(500, 2)).mean() - 1 / 20) < 0.01


def test_bad_settings_name_the_key_and_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"share=1\.5: must be < 1"):
        behaviour_settings("sparsify", share=1.5)
    with pytest.raises(ValueError, match="allowed are honest, isolate, sparsify, trap"):
        behaviour_settings("isolated")
    raw = {"clients": {"count": 1}, "server": {"behaviour": "trap", "trap": {"batch_size": 1}}}
    with pytest.raises(ConfigError, match=r"server\.trap\.batch_size = 1: must be >= 2"):
        parse_scenario(raw)
    with pytest.raises(ConfigError, match=r"unknown key 'server\.shares'"):
        parse_scenario({"clients": {"count": 1}, "server": {"shares": 0.1}})
    scenario = parse_scenario({"clients": {"count": 1}, "server": {"behaviour": "sparsify"}})
    assert scenario.server.behaviour.model_dump() == {"behaviour": "sparsify", "share": 0.1}


class _Grid:
    """The one thing the wrapper asks of Flower's grid: the nodes connected."""

    def __init__(self, nodes: Iterable[int] = ()) -> None:
        self.nodes = list(nodes)

    def get_node_ids(self) -> list[int]:
        return self.nodes


NO_NODES = _Grid()


class _Inner:
    """What the wrapper wraps: records what it was given to send, aggregates as FedAvg."""

    sent: ArrayRecord

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: object
    ) -> Iterable[Message]:
        self.sent = arrays
        return []

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return FedAvg().aggregate_train(server_round, replies)


def _reply(
    node: int, arrays: dict[str, np.ndarray], examples: int, client: int | None = None
) -> Message:
    sent = Message(RecordDict({}), dst_node_id=node, message_type=MessageType.TRAIN)
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": examples}),
        }
    )
    if client is not None:  # what a client declares in the clear
        content[CLIENT] = ConfigRecord({PARTITION_ID: client})
    return Message(content, reply_to=sent)


def test_the_wrapper_sends_the_tampered_layer_and_keeps_the_global_model_honest() -> None:
    weight, bias = _honest_layer()
    honest = {"1.weight": weight, "1.bias": bias, "3.weight": np.ones((2, WIDTH))}
    inner = _Inner()
    core = ServerCore(behaviour_settings("trap", batch_size=10), _inputs(500, 1), seed=0)
    wrapper = Tampering(inner, core, LAYER)  # type: ignore[arg-type]
    record = ArrayRecord({k: Array(v) for k, v in honest.items()})
    wrapper.configure_train(1, record, ConfigRecord(), NO_NODES)  # type: ignore[arg-type]
    sent = {k: inner.sent[k].numpy() for k in inner.sent}
    expected = BEHAVIOURS["trap"].first_layer(
        weight, bias, _inputs(500, 1), behaviour_settings("trap", batch_size=10),
        np.random.default_rng([0, 1]),
    )  # fmt: skip
    assert np.array_equal(sent["1.weight"], expected[0])
    assert np.array_equal(sent["1.bias"], expected[1])
    assert np.array_equal(sent["3.weight"], honest["3.weight"])
    rng = np.random.default_rng(3)
    updates = [{k: rng.standard_normal(v.shape) for k, v in sent.items()} for _ in range(3)]
    examples = [5, 10, 20]
    replies = [
        _reply(i + 1, {k: sent[k] + u[k] for k in sent}, n)
        for i, (u, n) in enumerate(zip(updates, examples, strict=True))
    ]
    arrays, _ = wrapper.aggregate_train(1, replies)
    assert arrays is not None
    for key, value in honest.items():  # honest + the weighted mean update, as computed by hand
        mean = sum(n * u[key] for u, n in zip(updates, examples, strict=True)) / sum(examples)
        assert np.allclose(arrays[key].numpy(), value + mean, atol=1e-12)


def test_under_the_message_api_each_node_gets_its_own_layer_and_the_model_stays_honest() -> None:
    # isolate without SecAgg+: node 30 is client 1, the target; 10 and 20 are sent a dead layer
    # once the server knows who they are.
    weight, bias = _honest_layer()
    honest = {"1.weight": weight, "1.bias": bias, "3.weight": np.ones((2, WIDTH))}
    record = ArrayRecord({k: Array(v) for k, v in honest.items()})
    nodes, clients, examples = (10, 20, 30), (0, 2, 1), (5, 10, 20)
    core = ServerCore(behaviour_settings("isolate", target=1), _inputs(10, 1), seed=0)
    wrapper = Tampering(FedAvg(min_available_nodes=3), core, LAYER)
    rng = np.random.default_rng(3)
    for server_round in (1, 2):
        messages = list(wrapper.configure_train(server_round, record, ConfigRecord(), _Grid(nodes)))  # type: ignore[arg-type]
        sent = {int(m.metadata.dst_node_id): m.content["arrays"] for m in messages}
        assert sorted(sent) == list(nodes)
        for node, client in zip(nodes, clients, strict=True):
            got = sent[node]
            assert np.array_equal(got["3.weight"].numpy(), honest["3.weight"])
            if server_round == 1 or client == 1:  # not yet told apart, or the target
                assert np.array_equal(got["1.weight"].numpy(), weight)
                assert np.array_equal(got["1.bias"].numpy(), bias)
            else:
                assert not got["1.weight"].numpy().any() and (got["1.bias"].numpy() < 0).all()
            assert core.sent_to(server_round, node)[0] is not None
        updates = {n: {k: rng.standard_normal(v.shape) for k, v in honest.items()} for n in nodes}
        replies = [
            _reply(n, {k: sent[n][k].numpy() + updates[n][k] for k in honest}, e, c)
            for n, c, e in zip(nodes, clients, examples, strict=True)
        ]
        arrays, _ = wrapper.aggregate_train(server_round, replies)
        assert arrays is not None
        for key, value in honest.items():  # honest + the weighted mean update, by hand
            mean = sum(e * updates[n][key] for n, e in zip(nodes, examples, strict=True))
            assert np.allclose(arrays[key].numpy(), value + mean / sum(examples), atol=1e-12)
    assert core.partitions.known() == dict(zip(nodes, clients, strict=True))


def test_the_check_fires_on_tampered_layers_and_stays_quiet_on_honest_ones() -> None:
    batch = torch.from_numpy(_inputs(64, 5))
    weight, bias = _honest_layer()
    quiet = check_first_layer(torch.from_numpy(weight), torch.from_numpy(bias), batch)
    assert not quiet.flagged and quiet.reason == "" and 0.4 < quiet.active_share < 0.6
    # Also after honest training: a few SGD steps of a small classifier.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(N_IN, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)).double()
    labels = torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(net.parameters(), lr=0.2)
    for _ in range(20):
        opt.zero_grad()
        nn.functional.cross_entropy(net(batch), labels).backward()
        opt.step()
    layer = net[0]
    assert isinstance(layer, nn.Linear)
    assert not check_first_layer(layer.weight.detach(), layer.bias.detach(), batch).flagged
    for behaviour, settings in (("sparsify", {"share": 0.1}), ("trap", {"batch_size": 64})):
        sent_w, sent_b = _sent(behaviour, **settings)
        found = check_first_layer(torch.from_numpy(sent_w), torch.from_numpy(sent_b), batch)
        assert found.flagged and "activates" in found.reason and found.active_share < 0.25


def test_the_analytic_attack_recovers_exactly_each_sample_a_trap_neuron_isolates() -> None:
    sent_w, sent_b = _sent("trap", batch_size=16)
    x = torch.from_numpy(_inputs(16, 7))
    torch.manual_seed(1)
    first = nn.Linear(N_IN, WIDTH).double()
    with torch.no_grad():
        first.weight.copy_(torch.from_numpy(sent_w))
        first.bias.copy_(torch.from_numpy(sent_b))
    net = nn.Sequential(first, nn.ReLU(), nn.Linear(WIDTH, 10).double())
    nn.functional.cross_entropy(net(x), torch.randint(0, 10, (16,))).backward()
    assert first.weight.grad is not None and first.bias.grad is not None
    obs = observe_layer(
        first.weight.grad, first.bias.grad, sent_w, sent_b, torch.device("cpu"), None
    )
    rec = run_analytic(obs, AnalyticConfig(seed=0))
    # Brute force: the samples that at least two neurons fire for alone.
    active = (x @ first.weight.T + first.bias > 0).detach().numpy()
    alone = active.sum(axis=0) == 1
    owners = active[:, alone].argmax(axis=0)
    isolated = sorted(i for i in set(owners.tolist()) if (owners == i).sum() >= 2)
    assert len(isolated) >= 4 and rec.batch_size == len(isolated)
    errors = torch.cdist(x[isolated], rec.inputs).amin(dim=1)
    assert float(errors.max()) < 1e-8 and bool(rec.certified.all())


# One of the eight in the default run (a federation costs about half a minute): the trap's
# recovery under the Message API; the rest, per-client models included, with -m slow.
STACKS = [
    pytest.param(b, s, marks=() if (b, s) == ("trap", "message") else pytest.mark.slow)
    for b in ("honest", "sparsify", "trap", "isolate")
    for s in ("message", "secagg")
]


@pytest.mark.parametrize(("behaviour", "stack"), STACKS)
def test_every_behaviour_runs_under_the_message_api_and_under_secagg(
    tmp_path: Path, behaviour: str, stack: str
) -> None:
    raw: dict[str, Any] = {
        "rounds": 2,
        "data": {"source": "photos", "samples_per_client": 10, "test_size": 40},
        "model": {"width": 100, "depth": 3},
        "clients": {"count": 3, "batch_size": 10, "lr": 0.05},
        "server": {"behaviour": behaviour, "trap": {"batch_size": 10}, "isolate": {"target": 1}},
        "audit": {"attacks": ["analytic"], "grids": False},
    }
    if stack == "secagg":
        raw["federation"] = {"secagg": {"max_weight": 10.0, "quantization_range": 2**26}}
    run_dir = run_scenario(parse_scenario(raw), raw, tmp_path / "run")
    rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert {r["server_behaviour"] for r in rounds} == {behaviour}
    assert all(np.isfinite(r["test_accuracy"]) for r in rounds)
    clients = {
        (c["round"], c["client"]): c
        for c in map(json.loads, (run_dir / "clients.jsonl").read_text().splitlines())
    }
    assert sorted(clients) == [(r, c) for r in (1, 2) for c in range(3)]
    for (r, c), row in clients.items():
        # isolate: every node honest until the server knows who is who, then only the target.
        tampered = behaviour in ("sparsify", "trap") or (
            behaviour == "isolate" and r == 2 and c != 1
        )
        assert row["tamper_flagged"] == tampered, (r, c, row)
    records = [json.loads(x) for x in (run_dir / "audit.jsonl").read_text().splitlines()]
    assert {r["server_behaviour"] for r in records} == {behaviour}
    assert all(r["attack"] == "analytic" for r in records)
    mine = {(r["round"], r["client"]): r for r in records if r["client"] >= 0}
    assert sorted(mine) == sorted(clients)
    assert all(r["tamper_flagged"] == clients[k]["tamper_flagged"] for k, r in mine.items())
    flagged = sum(c["tamper_flagged"] for c in clients.values())
    line = f"Server behaviour: {behaviour}; the clients' check flagged the model it sent in"
    assert f"{line} {flagged} of 6 replies" in (run_dir / "report.html").read_text()
    if behaviour == "trap" and stack == "message":  # a trap at B = 10 on m = 100 isolates
        assert max(r["share_exact"] for r in records) > 0  # some samples exactly
