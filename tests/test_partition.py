"""Partitions: sizes, disjointness, determinism by seed, label skew."""

from __future__ import annotations

import numpy as np
import pytest

from fl_sim.data.partition import partition_dirichlet, partition_iid, split_holdout


@pytest.mark.parametrize("seed", range(3))
def test_iid_sizes_disjoint_seeded(seed: int) -> None:
    parts = partition_iid(100, 4, 20, seed)
    assert [len(p) for p in parts] == [20] * 4
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == 80 and joined.max() < 100
    assert all(
        np.array_equal(a, b) for a, b in zip(parts, partition_iid(100, 4, 20, seed), strict=True)
    )
    assert not np.array_equal(parts[0], partition_iid(100, 4, 20, seed + 1)[0])


@pytest.mark.parametrize("seed", range(3))
def test_dirichlet_sizes_disjoint_and_skewed(seed: int) -> None:
    labels = np.repeat(np.arange(10), 100)
    parts = partition_dirichlet(labels, 5, 50, alpha=0.1, seed=seed)
    assert [len(p) for p in parts] == [50] * 5
    assert len(np.unique(np.concatenate(parts))) == 250
    # alpha = 0.1: each client is dominated by few classes
    top_share = [np.bincount(labels[p], minlength=10).max() / 50 for p in parts]
    assert np.mean(top_share) > 0.4
    iid_top = [
        np.bincount(labels[p], minlength=10).max() / 50
        for p in partition_dirichlet(labels, 5, 50, alpha=1000.0, seed=seed)
    ]
    assert np.mean(iid_top) < np.mean(top_share)


def test_too_many_samples_asked() -> None:
    with pytest.raises(ValueError, match="> 50 available"):
        partition_iid(50, 3, 20, 0)


def test_holdout() -> None:
    train, test = split_holdout(30, 10, 0)
    assert len(test) == 10 and len(train) == 20 and not set(train) & set(test)
