"""Data of another shape: the breast-cancer records (30 features, 2 classes) and what travels
with them, beside the images' description, which must stay what it was."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_sim.audit.heatmap import save_heatmap
from fl_sim.audit.metrics import PSNR_CAP, match_and_score
from fl_sim.config import DataSpec, ModelSpec
from fl_sim.data.breast_cancer import load_breast_cancer_records
from fl_sim.data.description import DataDescription
from fl_sim.data.federated import federated_data
from fl_sim.data.normalize import Normalization
from fl_sim.data.records import RecordSet
from fl_sim.model import first_linear

TABULAR = DataSpec(source="breast_cancer", samples_per_client=50, test_size=100)


def test_breast_cancer_records_and_their_range() -> None:
    pool = load_breast_cancer_records()
    assert pool.records.shape == (569, 30) and pool.num_classes == 2
    assert set(np.unique(pool.labels)) == {0, 1} and len(pool.feature_names) == 30
    assert pool.low == tuple(pool.records.min(0)) and pool.high == tuple(pool.records.max(0))


def test_the_description_travels_with_tabular_data() -> None:
    data = federated_data(TABULAR, 3, 0)
    described = data.description
    assert described.input_shape == (30,) and described.num_classes == 2
    assert not described.is_image and described.input_dim == 30
    unit = data.unit(np.arange(len(data.labels)))
    assert unit.shape == (569, 30) and unit.min() == 0.0 and unit.max() == 1.0
    x, y = data.tensors(np.concatenate(data.partitions))
    assert x.shape == (150, 30) and x.dtype == torch.float32 and set(y.tolist()) <= {0, 1}
    # Standardised with the training split's statistics: close to 0 and 1 on the clients' data.
    assert x.mean(0).abs().max() < 0.5 and (x.std(0) - 1).abs().max() < 0.5
    net = ModelSpec(width=40, depth=3).build(described)
    _, layer = first_linear(net)
    assert layer.in_features == 30 and net[-1].out_features == 2
    assert net(x.double()).shape == (150, 2)


def test_images_keep_their_description() -> None:
    data = federated_data(DataSpec(source="photos", samples_per_client=10, test_size=20), 2, 0)
    described = data.description
    assert described.input_shape == (3, 32, 32) and described.num_classes == 10
    assert described.is_image and described.low == (0.0,) * 3 and described.high == (255.0,) * 3
    ids = data.partitions[0]
    assert torch.equal(data.unit(ids), torch.from_numpy(data.records[ids]).double() / 255)
    net = ModelSpec(width=40, depth=3).build(described)
    assert first_linear(net)[1].in_features == 3072 and net[-1].out_features == 10


def test_descriptions_and_record_sets_refuse_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match=r"normalisation of 3-D samples for samples of shape"):
        DataDescription((30,), 2, (0.0,) * 30, (1.0,) * 30, Normalization())
    records = np.zeros((4, 2))
    with pytest.raises(ValueError, match=re.escape("labels must lie in 0..1")):
        RecordSet(records, np.array([0, 1, 2, 0]), "t", 2, (0.0, 0.0), (1.0, 1.0))
    with pytest.raises(ValueError, match="high > low"):
        RecordSet(records, np.zeros(4, np.int64), "t", 2, (0.0, 0.0), (1.0, 0.0))


def test_records_are_scored_without_ssim() -> None:
    g = torch.Generator().manual_seed(0)
    orig = torch.rand(5, 30, generator=g, dtype=torch.float64)
    perm = torch.tensor([2, 0, 4, 1, 3])
    q = match_and_score(orig[perm].clone(), orig)
    assert np.array_equal(perm[q.match].numpy(), np.arange(5))
    assert np.all(q.psnr == PSNR_CAP) and q.ssim is None
    summary = q.summary()
    assert summary["ssim_mean"] is None and summary["batch_exact"]


def test_heatmap_of_a_batch(tmp_path: Path) -> None:
    orig = np.random.default_rng(0).random((6, 30))
    path = save_heatmap(orig, np.zeros_like(orig), tmp_path / "g" / "r001-c000.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
