"""flowerapp: a plain PyTorch ClientApp (one line of fl-sim, marked, so records name each
client's partition rather than its node id)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader

from clients.declare import declare_partition  # fl-sim
from flowerapp.task import Net, load_data
from flowerapp.task import test as test_fn
from flowerapp.task import train as train_fn

app = ClientApp(mods=[declare_partition])  # fl-sim: the mod


def _data(
    context: Context,
) -> tuple[DataLoader[tuple[torch.Tensor, ...]], DataLoader[tuple[torch.Tensor, ...]]]:
    return load_data(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        int(context.run_config["samples-per-client"]),
        int(context.run_config["batch-size"]),
    )


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = _data(context)
    train_loss = train_fn(
        model,
        trainloader,
        int(context.run_config["local-epochs"]),
        float(msg.content["config"]["lr"]),
    )
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(trainloader.sampler)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the test images."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, testloader = _data(context)
    loss, accuracy = test_fn(model, testloader)
    metrics = MetricRecord(
        {"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(testloader.dataset)}
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
