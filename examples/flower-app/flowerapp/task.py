"""flowerapp: the model, the data and the training, in plain PyTorch."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

# 8 x 8 grey digits, pixels 0..16 scaled to [0, 1], then normalised.
INPUT_SHAPE = (1, 8, 8)
MEAN, STD = (0.3,), (0.4,)
TEST_SIZE = 300


class Net(nn.Sequential):
    """A small fully connected classifier of the 64 pixels."""

    def __init__(self, width: int = 200) -> None:
        super().__init__(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    digits = load_digits()
    pixels = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return (pixels - MEAN[0]) / STD[0], torch.tensor(digits.target)


def load_data(
    partition_id: int, num_partitions: int, samples: int, batch_size: int
) -> tuple[DataLoader[tuple[torch.Tensor, ...]], DataLoader[tuple[torch.Tensor, ...]]]:
    """A fresh batch of this client's ``samples`` training images each round (one SGD step
    per epoch), and the shared test images."""
    x, y = _digits()
    train_x, train_y = x[TEST_SIZE:], y[TEST_SIZE:]
    if partition_id >= num_partitions or samples * num_partitions > len(train_x):
        raise ValueError(f"partition {partition_id} of {num_partitions} x {samples} samples")
    part = slice(partition_id * samples, (partition_id + 1) * samples)
    train = TensorDataset(train_x[part], train_y[part])
    test = TensorDataset(x[:TEST_SIZE], y[:TEST_SIZE])
    batches = RandomSampler(train, num_samples=batch_size)
    return (
        DataLoader(train, batch_size=batch_size, sampler=batches),
        DataLoader(test, batch_size=100),
    )


def train(
    net: nn.Module, loader: DataLoader[tuple[torch.Tensor, ...]], epochs: int, lr: float
) -> float:
    """SGD on the client's images; the mean training loss."""
    optimiser = torch.optim.SGD(net.parameters(), lr=lr)
    net.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for images, labels in loader:
            optimiser.zero_grad()
            loss = nn.functional.cross_entropy(net(images), labels)
            loss.backward()
            optimiser.step()
            total, batches = total + loss.item(), batches + 1
    return total / max(batches, 1)


def test(net: nn.Module, loader: DataLoader[tuple[torch.Tensor, ...]]) -> tuple[float, float]:
    """Loss and accuracy on the test images."""
    net.eval()
    loss, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in loader:
            out = net(images)
            loss += nn.functional.cross_entropy(out, labels, reduction="sum").item()
            correct += int((out.argmax(1) == labels).sum())
            seen += len(labels)
    return loss / seen, correct / seen
