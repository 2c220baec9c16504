"""What the server records as a run goes: the data it runs on, global test metrics and
per-client training rows (also for clients left out of aggregation, with their status and
reason), appended line by line so an interrupted run keeps every finished round."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common import Scalar
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords
from torch import nn

from clients.reply import CLIENT, OK, PARTITION_ID, SERVER_ROUND, TRAIN_LOSS
from fl_sim.apps.checkpoint import save_global
from fl_sim.config.schema import Scenario
from fl_sim.data.federated import FederatedData, federated_data
from fl_sim.rundir import CLIENTS, DATA, ROUNDS, append_jsonl, read_jsonl, write_json, write_jsonl
from strategies import LeftOut

if TYPE_CHECKING:  # fl_sim.progress reads the audit's records, whose module reads these
    from fl_sim.progress import RunProgress


def data_facts(data: FederatedData) -> dict[str, Any]:
    """What ``data.json`` says of the data a run used: the dataset actually loaded, its input
    shape, classes, value range and normalisation (the report's and the judge's scales)."""
    described = data.description
    return {
        "source": data.source,
        "pool_size": len(data.labels),
        "test_size": len(data.test),
        "input_shape": list(described.input_shape),
        "num_classes": described.num_classes,
        "value_range": {"low": described.low, "high": described.high},
        "feature_names": described.feature_names,
        "normalization": asdict(described.normalization),
    }


class RunRecorder:
    """Server-side bookkeeping of one run.

    Parameters
    ----------
    scenario
        The run.
    run_dir
        Where ``data.json`` is written and ``rounds.jsonl`` and ``clients.jsonl`` grow.
    progress
        Told each round's test metrics (``None``: silent).
    round_epsilon
        Round -> the federation's epsilon after it, under central DP: written beside each
        round's test metrics.
    """

    def __init__(
        self,
        scenario: Scenario,
        run_dir: Path,
        progress: RunProgress | None = None,
        round_epsilon: Callable[[int], float] | None = None,
    ):
        self.scenario = scenario
        self.round_epsilon = round_epsilon
        self.run_dir = run_dir
        self.progress = progress
        self.started = time.perf_counter()
        self.data = federated_data(scenario.data, len(scenario.clients), scenario.seed)
        write_json(run_dir / DATA, data_facts(self.data))
        x, self._y = self.data.tensors(self.data.test)
        self._x = x.to(getattr(torch, scenario.model.dtype))
        self._left_out: Counter[int] = Counter()  # replies left out, per round

    def public_inputs(self) -> np.ndarray:
        """The server's own test inputs as the first layer takes them (N x n, float64): the
        statistics of the data a dishonest server may shape the model it sends with."""
        return self._x.flatten(1).double().numpy()

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Test loss and accuracy of the global model (round 0: before training)."""
        model = self.scenario.model.build(self.data.description)
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            logits = model(self._x)
            loss = float(nn.functional.cross_entropy(logits, self._y))
            accuracy = float((logits.argmax(dim=1) == self._y).float().mean())
        row = {
            "round": server_round,
            "test_loss": loss,
            "test_accuracy": accuracy,
            "server_behaviour": self.scenario.server.behaviour.behaviour,
            "seconds": time.perf_counter() - self.started,
        }
        if self.round_epsilon is not None and server_round > 0:
            row["epsilon"] = self.round_epsilon(server_round)
        append_jsonl(self.run_dir / ROUNDS, row)
        save_global(self.run_dir, server_round, arrays)  # what a killed run resumes from
        self._show(row)
        return MetricRecord({"test-loss": loss, "test-accuracy": accuracy})

    def resume_after(self, server_round: int) -> None:
        """Forget the rows of the rounds after ``server_round`` (the round a killed run was in
        when it died, to be run again); each file is rewritten whole."""
        for name in (ROUNDS, CLIENTS):
            rows = read_jsonl(self.run_dir / name)
            kept = [
                r for r in rows if not isinstance(r.get("round"), int) or r["round"] <= server_round
            ]
            if len(kept) < len(rows):
                write_jsonl(self.run_dir / name, kept)

    def client_metrics(self, contents: list[RecordDict], weighted_by_key: str) -> MetricRecord:
        """Record each client's declared settings, loss and epsilon; aggregate as FedAvg does."""
        for content in contents:
            declared = content.get(CLIENT)
            if isinstance(declared, ConfigRecord):
                row = {
                    "round": declared.get(SERVER_ROUND),
                    "client": declared.get(PARTITION_ID),
                    "status": OK,
                }
                row |= {k.replace("-", "_"): v for k, v in declared.items()}
                append_jsonl(self.run_dir / CLIENTS, row)
        return aggregate_metricrecords(contents, weighted_by_key)

    def legacy_client_metrics(
        self, fit_metrics: list[tuple[int, dict[str, Scalar]]]
    ) -> dict[str, Scalar]:
        """As :meth:`client_metrics`, for the legacy strategy under SecAgg+, whose clients
        declare themselves in their fit metrics: the weighted mean training loss."""
        for _, declared in fit_metrics:
            row = {"round": declared.get(SERVER_ROUND), "client": declared.get(PARTITION_ID)}
            row |= {"status": OK} | {k.replace("-", "_"): v for k, v in declared.items()}
            append_jsonl(self.run_dir / CLIENTS, row)
        total = sum(n for n, _ in fit_metrics)
        loss = sum(n * float(m[TRAIN_LOSS]) for n, m in fit_metrics) / total
        return {TRAIN_LOSS: loss}

    def left_out(self, fault: LeftOut) -> None:
        """Record a client left out of aggregation: what it declared, the status and the
        reason (the server's, where it rejected what the client called ``ok``)."""
        row: dict[str, Any] = {
            "round": fault.server_round,
            "client": fault.client,
            "node_id": fault.node_id,
        }
        row |= {k.replace("-", "_"): v for k, v in fault.declared.items()}
        row |= {"status": fault.status, "reason": fault.reason}
        append_jsonl(self.run_dir / CLIENTS, row)
        self._left_out[fault.server_round] += 1

    def _show(self, row: dict[str, Any]) -> None:
        if self.progress is not None:
            done = int(row["round"])
            self.progress.round_done(
                done, row["test_accuracy"], row["test_loss"], self._left_out[done]
            )
