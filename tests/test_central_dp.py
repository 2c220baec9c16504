"""Central DP with Flower's fixed-clipping wrappers: the honest-but-curious server, outside
the wrapper, gets every update clipped (client side) or as sent (server side) and never noised;
Flower's noise reaches only the aggregate. And the epsilon the run reports."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity

from clients import PrivacyLedger
from fl_sim.apps.central_dp import central_epsilon, with_central_dp
from fl_sim.apps.client import client_mods, client_reply
from fl_sim.apps.server import initial_arrays
from fl_sim.config import Scenario, parse_scenario
from fl_sim.data.federated import federated_data
from strategies import HonestButCurious, InterceptedUpdate

CLIP = 0.05
SIGMA = 0.5


@pytest.fixture(autouse=True)
def _identity() -> Iterator[None]:
    """Messages made outside a running app need an identity; restored afterwards."""
    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before


def _scenario(clipping: str) -> Scenario:
    return parse_scenario(
        {
            "rounds": 2,
            "data": {"source": "photos", "samples_per_client": 20, "test_size": 40},
            "model": {"width": 30, "depth": 3},
            "clients": {"count": 4, "batch_size": 5, "lr": 0.5},
            "federation": {
                "central_dp": {
                    "noise_multiplier": SIGMA, "clipping_norm": CLIP, "clipping": clipping
                }
            },
        }
    )  # fmt: skip


Arrays = dict[str, np.ndarray]


def _norm(a: Arrays, b: ArrayRecord) -> float:
    return float(np.sqrt(sum(((a[k] - b[k].numpy()) ** 2).sum() for k in a)))


def _round(
    clipping: str,
) -> tuple[ArrayRecord, list[Arrays], list[InterceptedUpdate], ArrayRecord]:
    """One round of the scenario's 4 clients through their mods and the server's strategies:
    the global model, each reply's arrays as sent (the server-side wrapper clips the replies in
    place), what the honest-but-curious server intercepted, and the aggregate."""
    scenario = _scenario(clipping)
    described = federated_data(scenario.data, 4, scenario.seed).description
    start = initial_arrays(scenario, described)
    dp = with_central_dp(FedAvg(), scenario.federation.central_dp, 4)  # type: ignore[arg-type]
    seen: list[InterceptedUpdate] = []
    layer = scenario.model.attacked_layer(described)
    strategy = HonestButCurious(dp, seen.append, layer, keep_whole=lambda r, d: True)
    strategy._sent = {1: (start[layer[0]].numpy(), start[layer[1]].numpy())}
    strategy._sent_all = {1: {k: start[k].numpy() for k in start}}
    config = ConfigRecord({"server-round": 1})
    if clipping == "client":  # what the client-side wrapper's configure_train adds
        config["clipping_norm"] = CLIP
    else:
        dp.current_arrays = start  # type: ignore[attr-defined]
    replies = []
    for client in range(4):
        sent = Message(
            RecordDict({"arrays": start, "config": config}),
            dst_node_id=client + 1,
            message_type=MessageType.TRAIN,
        )
        context = Context(1, client + 1, {"partition-id": client}, RecordDict(), {})

        def train(msg: Message, ctx: Context, client: int = client) -> Message:
            return Message(client_reply(scenario, msg.content, client, ctx.state), reply_to=msg)

        mods = client_mods(scenario)
        assert mods == ([fixedclipping_mod] if clipping == "client" else [])
        replies.append(mods[0](sent, context, train) if mods else train(sent, context))
    sent_back = [{k: v.numpy().copy() for k, v in r.content["arrays"].items()} for r in replies]
    aggregate, _ = strategy.aggregate_train(1, replies)
    assert aggregate is not None
    return start, sent_back, seen, aggregate


@pytest.mark.parametrize("clipping", ["client", "server"])
def test_the_server_sees_each_update_unnoised_and_the_noise_reaches_only_the_aggregate(
    clipping: str,
) -> None:
    start, replies, seen, aggregate = _round(clipping)
    assert len(seen) == 4
    norms = []
    for update, reply in zip(seen, replies, strict=True):
        sent, received = update.whole()
        # What the honest-but-curious server holds is the reply, bit for bit: no noise.
        for k in received:
            np.testing.assert_array_equal(received[k], reply[k])
        norms.append(float(np.sqrt(sum(((received[k] - sent[k]) ** 2).sum() for k in sent))))
    if clipping == "client":  # fixedclipping_mod clipped every update before it left
        assert max(norms) <= CLIP * (1 + 1e-9)
    else:  # the server's wrapper clips later, inside: the server saw the raw updates
        assert min(norms) > CLIP
    # The aggregate is the mean of the clipped updates plus Flower's Gaussian noise of std
    # sigma x C / n per entry.
    deviation = []
    for k in start:
        updates = []
        for reply in replies:
            delta = reply[k] - start[k].numpy()
            norm = _norm(reply, start)
            updates.append(delta * min(1.0, CLIP / norm))
        mean = start[k].numpy() + np.mean(updates, axis=0)
        deviation.append((aggregate[k].numpy() - mean).ravel())
    noise = np.concatenate(deviation)
    assert noise.std() == pytest.approx(SIGMA * CLIP / 4, rel=0.05)


def test_epsilon_is_opacus_rdp_of_flowers_noise_with_every_client_every_round() -> None:
    epsilon = central_epsilon(_scenario("client"))
    assert epsilon is not None
    want = [PrivacyLedger().spend(SIGMA, 1.0, r).epsilon(1e-5) for r in (1, 2, 3)]
    assert [epsilon(r) for r in (1, 2, 3)] == want
    assert want[0] < want[1] < want[2]
    assert central_epsilon(parse_scenario({})) is None
