"""The attacked layer found by what ``forward`` computes, for models written the ways people
write them; refused, naming what was found, where SPEAR++ cannot attack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity
from torch import nn

from fl_sim.attacked_layer import LayerError, traced_layers
from fl_sim.audit.audited import AuditedStrategy, AuditError, find_layer
from fl_sim.config.schema import AuditSpec
from fl_sim.model import fc_relu_net, first_linear, next_linear
from fl_sim.rundir import AUDIT, read_jsonl
from tests.test_rundir import _LocalClients


class FunctionalRelu(nn.Module):
    """Flower's PyTorch examples: activations as ``F.relu`` in ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(48, 20), nn.Linear(20, 12), nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> Any:
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class ReusedRelu(nn.Module):
    """One ``nn.ReLU`` declared after every Linear and reused; ``view`` by ``size(0)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(48, 20), nn.Linear(20, 3)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> Any:
        return self.fc2(self.act(self.fc1(x.view(x.size(0), -1))))


class DeclaredBackwards(nn.Module):
    """The head declared before the first layer; ``.relu()`` as a method, in place."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(20, 3)
        self.body = nn.Linear(48, 20)

    def forward(self, x: torch.Tensor) -> Any:
        return self.head(self.body(x.reshape(x.shape[0], -1)).relu_())


class TorchReluInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(48, 20), nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> Any:
        return self.out(F.relu(self.fc(x), inplace=True))


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc1, self.fc2 = nn.Conv2d(3, 4, 3), nn.Linear(4 * 2 * 2, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> Any:
        x = torch.flatten(F.relu(self.conv(x)), 1)
        return self.fc2(F.relu(self.fc1(x)))


class SigmoidAfter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(48, 20), nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> Any:
        return self.out(torch.sigmoid(self.fc(torch.flatten(x, 1))))


class SkipConnection(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.out = nn.Linear(48, 20), nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> Any:
        h = self.fc(x)
        return self.out(F.relu(h) + h)


@pytest.mark.parametrize(
    ("model", "first", "following"),
    [
        (FunctionalRelu(), "fc1", "fc2"),
        (ReusedRelu(), "fc1", "fc2"),
        (DeclaredBackwards(), "body", "head"),
        (TorchReluInPlace(), "fc", "out"),
        (nn.Sequential(nn.Flatten(), nn.Linear(48, 9), nn.ReLU(inplace=True), nn.Linear(9, 3)),
         "1", "3"),
        (fc_relu_net(width=16, depth=3, input_dim=48, num_classes=3), "1", "3"),
    ],
)  # fmt: skip
def test_the_first_linear_the_input_reaches_and_the_one_after_its_relu(
    model: nn.Module, first: str, following: str
) -> None:
    assert traced_layers(model) == (first, following)
    name, layer = first_linear(model)
    assert name == first and layer is model.get_submodule(first)
    found = next_linear(model)
    assert found is not None and found[0] == following


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (Cnn(), r"the input reaches Conv2d 'conv' before any nn\.Linear"),
        (SigmoidAfter(), "the linear layer 'fc' is followed by sigmoid, not ReLU"),
        (SkipConnection(), "the linear layer 'fc' is followed by add, not ReLU"),
        (nn.Sequential(nn.Flatten(), nn.Conv1d(1, 1, 1)), r"Conv1d '1' before any nn\.Linear"),
    ],
)
def test_what_cannot_be_attacked_is_refused_naming_what_was_found(
    model: nn.Module, message: str
) -> None:
    with pytest.raises(LayerError, match=message):
        first_linear(model)


def test_a_named_layer_is_checked_not_searched() -> None:
    assert traced_layers(Cnn(), "fc1") == ("fc1", "fc2")  # what reaches it is the user's call
    with pytest.raises(LayerError, match="the linear layer 'fc2' is followed by output, not ReLU"):
        traced_layers(Cnn(), "fc2")
    with pytest.raises(LayerError, match=r"layer='conv': forward calls no nn\.Linear"):
        traced_layers(Cnn(), "conv")


class DataDependent(nn.Module):
    """Control flow on values: torch.fx cannot trace it; declaration order is used instead."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(48, 20), nn.ReLU(), nn.Linear(20, 3)

    def forward(self, x: torch.Tensor) -> Any:
        if x.sum() > 0:
            x = -x
        return self.out(self.act(self.fc(x)))


def test_an_untraceable_forward_falls_back_to_declaration_order() -> None:
    assert first_linear(DataDependent())[0] == "fc"


def test_the_audited_strategys_layer_from_the_model_as_people_write_it() -> None:
    model = FunctionalRelu()
    arrays = ArrayRecord(model.state_dict())
    assert find_layer(arrays, model=model) == ("fc1.weight", "fc1.bias")
    assert find_layer(arrays, layer="fc1", model=model) == ("fc1.weight", "fc1.bias")
    backwards = DeclaredBackwards()  # its first array is the head's: the model tells
    assert find_layer(ArrayRecord(backwards.state_dict()), model=backwards)[0] == "body.weight"
    cnn = Cnn()
    with pytest.raises(AuditError, match=r"model: the input reaches Conv2d 'conv'"):
        find_layer(ArrayRecord(cnn.state_dict()), model=cnn)
    with pytest.raises(AuditError, match="model: the linear layer 'fc' is followed by sigmoid"):
        find_layer(ArrayRecord(SigmoidAfter().state_dict()), model=SigmoidAfter())
    with pytest.raises(AuditError, match="layer='fc9': the model has no module of that name"):
        find_layer(arrays, layer="fc9", model=DataDependent())


class _Styled(nn.Module):
    """One 64-pixel MLP written in each of the ways people write it."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style
        if style == "declared-backwards":  # the head first; .relu_() as a method
            self.head = nn.Linear(200, 10)
            self.fc1 = nn.Linear(64, 200)
        else:
            self.fc1, self.head = nn.Linear(64, 200), nn.Linear(200, 10)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> Any:
        flat = x.view(x.size(0), -1)
        if self.style == "functional":
            return self.head(F.relu(self.fc1(flat)))
        if self.style == "reused-module":
            return self.head(self.act(self.fc1(flat)))
        if self.style == "torch-relu-in-place":
            return self.head(F.relu(self.fc1(flat), inplace=True))
        return self.head(self.fc1(flat).relu_())


@pytest.mark.parametrize(
    "style", ["functional", "reused-module", "torch-relu-in-place", "declared-backwards"]
)
def test_each_style_is_audited_through_the_documented_call(
    style: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's call, unchanged, on a ServerApp's rounds driven in-process: every update of
    every style reconstructed and certified."""
    for key, value in {"_task_id": 1, "_run_id": 1, "_node_id": 0}.items():
        monkeypatch.setattr(TaskIdentity, key, value)
    torch.manual_seed(0)
    model = _Styled(style)
    strategy = AuditedStrategy(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=2),
        tmp_path,
        model=model,
        input_shape=(1, 8, 8),
        settings=AuditSpec(spearpp={"time_budget_s": 30.0}),
    )
    strategy.start(
        grid=_LocalClients(_Styled(style)),
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=1,
    )
    assert strategy.layer == ("fc1.weight", "fc1.bias")
    records = read_jsonl(tmp_path / AUDIT)
    assert sorted(r["client"] for r in records) == [101, 202]
    assert all(r["status"] == "exact" and r["certified"] == 8 for r in records), records
