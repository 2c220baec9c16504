"""The ClientApp: each simulated client trains with its own training defence and replies with
its update, which its update mods (:class:`DefenceMods`) then transform, in their order.

A reply holds the updated weights (``arrays``), ``num-examples`` and the training loss
(``metrics``, averaged by FedAvg), the client's declared settings, status and epsilon
(``client``, a ConfigRecord, never averaged), and, in simulation only, which samples it trained
on (``audit``): ground truth for the judge, never read by the attack (keys:
:mod:`clients.reply`).

A client whose training diverges, or whose round fails in any other way, says so in a
well-formed failed reply (status ``diverged`` or ``client-error`` and the reason, no arrays,
``num-examples`` 0) rather than letting the error reach Flower, whose error reply carries no
content: the server can then record which client failed, and why.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

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
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.clientapp.typing import ClientAppCallable, Mod

from clients import DivergenceError, train_locally
from clients.defences import training_defences, update_mods
from clients.defences.base import BATCH_SIZE, DEFENCE, LR, STEPS
from clients.reply import (
    ACTIVE_SHARE,
    ARRAYS,
    AUDIT,
    CLIENT,
    CLIENT_ERROR,
    CONFIG,
    DIVERGED,
    METRICS,
    NUM_EXAMPLES,
    OK,
    PARTITION_ID,
    REASON,
    SAMPLE_IDS,
    SERVER_ROUND,
    STATUS,
    TAMPER_CHECKS,
    TAMPER_FLAGGED,
    TAMPER_REASON,
    TRAIN_LOSS,
)
from clients.tamper_check import check_first_layer
from clients.training import DIVERGENCE_FACTOR
from fl_sim.apps.checkpoint import ClientStore
from fl_sim.config.schema import Scenario
from fl_sim.data.federated import FederatedData, federated_data
from fl_sim.model import first_linear
from strategies.legacy import legacy_fit_mod

log = logging.getLogger(__name__)


def round_seed(scenario: Scenario, client: int, server_round: int) -> int:
    """Seed of one client's round: its batch draw and any randomness of its training."""
    return (scenario.seed * 1_000_003 + client * 10_007 + server_round) % 2**63


def drawn_samples(
    scenario: Scenario, data: FederatedData, client: int, server_round: int
) -> np.ndarray:
    """The ids of the samples ``client`` trains on in ``server_round``, sorted: its batch, drawn
    from its partition with its round's seed (so the judge can tell them without the client
    sending them, as under secure aggregation)."""
    spec = scenario.clients[client]
    rng = np.random.default_rng(round_seed(scenario, client, server_round))
    return np.sort(rng.choice(data.partitions[client], spec.batch_size, replace=False))


def _server_round(content: RecordDict) -> int:
    config = content.get(CONFIG)
    value = config.get(SERVER_ROUND) if isinstance(config, ConfigRecord) else None
    if not isinstance(value, int):
        raise ValueError(f"the server's message has no integer {CONFIG}[{SERVER_ROUND!r}]")
    return value


def failed_reply(
    declared: Mapping[str, ConfigRecordValues],
    status: str,
    reason: str,
    sample_ids: Sequence[int] = (),
) -> RecordDict:
    """The reply of a client whose round failed: what it declared, ``status`` and ``reason``,
    the samples it drew (if it got that far), no arrays and ``num-examples`` 0, so that
    nothing of it can be aggregated."""
    return RecordDict(
        {
            METRICS: MetricRecord({NUM_EXAMPLES: 0}),
            CLIENT: ConfigRecord({**declared, STATUS: status, REASON: reason}),
            AUDIT: ConfigRecord({SAMPLE_IDS: [int(i) for i in sample_ids]}),
        }
    )


def local_round(
    scenario: Scenario, content: RecordDict, client: int, state: RecordDict
) -> RecordDict:
    """One client's round: draw its batch, check the global weights' first layer on it
    (:func:`clients.tamper_check.check_first_layer`), train from them, build the reply.

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

    Returns
    -------
    RecordDict
        The update, or, when training diverged, a failed reply with status ``diverged`` (a
        diverged round releases no update, so it spends no privacy budget).

    Raises
    ------
    ValueError
        When the server's message lacks the global weights or the round number.
    """
    spec = scenario.clients[client]
    server_round = _server_round(content)
    arrays = content.get(ARRAYS)
    if not isinstance(arrays, ArrayRecord):
        raise ValueError(f"the server's message has no ArrayRecord {ARRAYS!r}")
    data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
    seed = round_seed(scenario, client, server_round)
    picked = drawn_samples(scenario, data, client, server_round)
    x, y = data.tensors(picked)
    x = x.to(getattr(torch, scenario.model.dtype))
    model = scenario.model.build(data.description)
    model.load_state_dict(arrays.to_torch_state_dict())
    _, layer = first_linear(model)
    with torch.no_grad():
        check = check_first_layer(layer.weight, layer.bias, x.flatten(1))
    training = spec.training
    defence = training_defences()[training.defence]
    declared: dict[str, ConfigRecordValues] = {
        SERVER_ROUND: server_round,
        PARTITION_ID: client,
        DEFENCE: training.defence,
        LR: training.lr,
        **defence.declare(training, spec.batch_size),
        BATCH_SIZE: spec.batch_size,
        TAMPER_FLAGGED: check.flagged,
        TAMPER_CHECKS: ", ".join(check.checks),
        TAMPER_REASON: check.reason,
        ACTIVE_SHARE: check.active_share,
    }
    try:
        result = train_locally(
            model,
            x,
            y,
            training,
            torch.Generator().manual_seed(seed),
            max_loss_growth=DIVERGENCE_FACTOR,
        )
    except DivergenceError as err:
        return failed_reply(declared, DIVERGED, str(err), picked.tolist())
    declared |= {STATUS: OK, STEPS: result.steps, TRAIN_LOSS: result.loss}
    declared |= defence.spend(training, result, state)
    return RecordDict(
        {
            ARRAYS: ArrayRecord(model.state_dict()),
            METRICS: MetricRecord({NUM_EXAMPLES: spec.batch_size, TRAIN_LOSS: result.loss}),
            CLIENT: ConfigRecord(declared),
            AUDIT: ConfigRecord({SAMPLE_IDS: [int(i) for i in picked]}),
        }
    )


def client_reply(
    scenario: Scenario,
    content: RecordDict,
    client: int,
    state: RecordDict,
    store: ClientStore | None = None,
) -> RecordDict:
    """:func:`local_round`, or, when it raises, a failed reply with status ``client-error``
    naming the error (its traceback goes to the client's log). With ``store``, a client
    started afresh (a resumed run) first restores its state as of its last round before this
    one, and keeps its state after the round (when it has any)."""
    try:
        if store is None:
            return local_round(scenario, content, client, state)
        server_round = _server_round(content)
        store.restore(client, server_round, state)
        reply = local_round(scenario, content, client, state)
        if len(state):
            store.save(client, server_round, state)
        return reply
    except Exception as err:  # the client's own failure: reported, never fatal to the run
        log.exception("client %d: its round failed", client)
        declared: dict[str, ConfigRecordValues] = {PARTITION_ID: client}
        with contextlib.suppress(ValueError):  # the server's message itself may be at fault
            declared[SERVER_ROUND] = _server_round(content)
        return failed_reply(declared, CLIENT_ERROR, f"{type(err).__name__}: {err}")


class DefenceMods:
    """The one ClientApp mod that applies each client's own update mods to its reply.

    Flower's mods are app-wide; this one looks up the client's spec (``spec_of(context)``: the
    scenario and the client's id) and runs the client's update mods around the training
    handler, the first to transform the reply innermost, each seeded from the round.
    """

    def __init__(self, spec_of: Callable[[Context], tuple[Scenario, int]]) -> None:
        self.spec_of = spec_of

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """The reply of ``call_next``, transformed by the client's update mods in order."""
        scenario, client = self.spec_of(context)
        spec = scenario.clients[client]
        if not spec.mods:
            return call_next(msg, context)
        try:
            seed = round_seed(scenario, client, _server_round(msg.content))
        except ValueError:  # the handler replies to a message without a round
            return call_next(msg, context)
        mods = update_mods()
        chain = call_next
        for settings in spec.mods:  # the first in the list ends up innermost
            chain = _around(mods[settings.defence].mod(settings, seed), chain)
        return chain(msg, context)


def _around(mod: Mod, call_next: ClientAppCallable) -> ClientAppCallable:
    """``call_next`` with ``mod`` around it, as Flower chains a ClientApp's mods."""
    return lambda msg, context: mod(msg, context, call_next)


def client_mods(scenario: Scenario) -> list[Mod]:
    """Flower's client mods the federation-wide defence needs: ``secaggplus_mod`` (with the
    legacy fit form it speaks) under SecAgg+, ``fixedclipping_mod`` under central DP with
    client-side clipping; none otherwise."""
    federation = scenario.federation
    if federation.secagg is not None:
        described = federated_data(scenario.data, len(scenario.clients), scenario.seed).description
        keys = list(scenario.model.build(described).state_dict())
        return [secaggplus_mod, legacy_fit_mod(keys)]
    if federation.central_dp is not None and federation.central_dp.clipping == "client":
        return [fixedclipping_mod]
    return []


def make_client_app(scenario: Scenario, run_dir: Path | None = None) -> ClientApp:
    """A ClientApp whose clients follow ``scenario`` (their partition id picks their spec),
    with the mods of its federation-wide defence (:func:`client_mods`); with ``run_dir``,
    each keeps its state there for a resumed run (:class:`ClientStore`)."""
    app = ClientApp(mods=client_mods(scenario))
    # Runs under a federation-wide defence do not resume (Flower's legacy workflow).
    wide = scenario.federation.wide_defence
    store = ClientStore(run_dir) if run_dir is not None and not wide else None

    def spec_of(context: Context) -> tuple[Scenario, int]:
        return scenario, int(context.node_config["partition-id"])

    @app.train(mods=[DefenceMods(spec_of)])
    def train(msg: Message, context: Context) -> Message:
        client = int(context.node_config["partition-id"])
        reply = client_reply(scenario, msg.content, client, context.state, store)
        return Message(reply, reply_to=msg)

    return app
