"""mlpapp: the model, the data and the training, as Flower's PyTorch examples write them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# 8 x 8 grey digits, pixels 0..16 scaled to [0, 1], then normalised.
INPUT_SHAPE = (1, 8, 8)
MEAN, STD = (0.3,), (0.4,)
TEST_SIZE = 300


class Net(nn.Module):
    """A multilayer perceptron: layers declared in ``__init__``, activations in ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 64)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    digits = load_digits()
    pixels = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return (pixels - MEAN[0]) / STD[0], torch.tensor(digits.target)


def load_data(
    partition_id: int, num_partitions: int, samples: int, batch_size: int
) -> tuple[DataLoader[tuple[torch.Tensor, ...]], DataLoader[tuple[torch.Tensor, ...]]]:
    """This client's ``samples`` training images in shuffled batches, and the test images."""
    x, y = _digits()
    train_x, train_y = x[TEST_SIZE:], y[TEST_SIZE:]
    if partition_id >= num_partitions or samples * num_partitions > len(train_x):
        raise ValueError(f"partition {partition_id} of {num_partitions} x {samples} samples")
    part = slice(partition_id * samples, (partition_id + 1) * samples)
    train = TensorDataset(train_x[part], train_y[part])
    test = TensorDataset(x[:TEST_SIZE], y[:TEST_SIZE])
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True),
        DataLoader(test, batch_size=100),
    )


def train(
    net: nn.Module,
    loader: DataLoader[tuple[torch.Tensor, ...]],
    epochs: int,
    lr: float,
    momentum: float,
) -> float:
    """Local epochs of momentum SGD; the mean training loss."""
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    net.train()
    running_loss, batches = 0.0, 0
    for _ in range(epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            loss.backward()
            optimizer.step()
            running_loss, batches = running_loss + loss.item(), batches + 1
    return running_loss / max(batches, 1)


def test(net: nn.Module, loader: DataLoader[tuple[torch.Tensor, ...]]) -> tuple[float, float]:
    """Loss and accuracy on the test images."""
    criterion = nn.CrossEntropyLoss(reduction="sum")
    net.eval()
    loss, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in loader:
            out = net(images)
            loss += criterion(out, labels).item()
            correct += int((out.argmax(1) == labels).sum())
            seen += len(labels)
    return loss / seen, correct / seen
