"""Splitting a dataset across clients (IID or Dirichlet label skew), with a held-out test split."""

from __future__ import annotations

import numpy as np


def split_holdout(n: int, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test) of a random split with ``test_size`` test samples."""
    if not 0 < test_size < n:
        raise ValueError(f"test_size={test_size}: need 0 < test_size < {n} samples")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[test_size:]), np.sort(order[:test_size])


def split_held_out(
    n: int, held_out: np.ndarray, test_size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test): ``test_size`` random records of the dataset's own test split
    ``held_out`` are the test set, every record outside it trains."""
    if not 0 < test_size <= len(held_out):
        raise ValueError(
            f"test_size={test_size}: the dataset's test split holds {len(held_out)} records"
        )
    test = np.random.default_rng(seed).choice(held_out, test_size, replace=False)
    return np.setdiff1d(np.arange(n), held_out), np.sort(test)


def partition_iid(n: int, clients: int, per_client: int, seed: int) -> list[np.ndarray]:
    """Disjoint random subsets of ``range(n)``, ``per_client`` each."""
    if clients * per_client > n:
        raise ValueError(
            f"{clients} clients x {per_client} samples = {clients * per_client} > {n} available"
        )
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(order[i * per_client : (i + 1) * per_client]) for i in range(clients)]


def partition_dirichlet(
    labels: np.ndarray, clients: int, per_client: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Disjoint subsets of ``per_client`` samples whose label mix follows Dirichlet(alpha).

    Each client draws class proportions p ~ Dir(alpha) and takes its samples class by class from
    what is left; a class that runs dry is replaced by the classes that still have samples.
    """
    if clients * per_client > len(labels):
        raise ValueError(
            f"{clients} clients x {per_client} samples = {clients * per_client} "
            f"> {len(labels)} available"
        )
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    parts = []
    for _ in range(clients):
        wanted = rng.multinomial(per_client, rng.dirichlet(alpha * np.ones(len(classes))))
        taken: list[int] = []
        for c, k in zip(classes, wanted, strict=True):
            taken += [pools[c].pop() for _ in range(min(k, len(pools[c])))]
        while len(taken) < per_client:  # top up from whatever classes still have samples
            c = rng.choice([c for c in classes if pools[c]])
            taken.append(pools[c].pop())
        parts.append(np.sort(np.asarray(taken, dtype=np.int64)))
    return parts
