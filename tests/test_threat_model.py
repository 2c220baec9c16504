"""The threat model's rules: what an honest-but-curious server sees and knows of an update or a
SecAgg+ sum, checked against the arithmetic written out by hand."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from clients.defences.local_dp import gaussian_std
from fl_sim.audit import threat_model
from fl_sim.audit.threat_model import NOISE_NOT_TOLD, ThreatModel, rounding_noise
from fl_sim.config.federation import SecAggSpec
from fl_sim.data.description import DataDescription
from fl_sim.data.normalize import Normalization
from fl_sim.model import fc_relu_net
from strategies import InterceptedAggregate, InterceptedUpdate
from strategies.quantisation import secagg_noise_std

LAYER = ("1.weight", "1.bias")
NEXT = ("3.weight", "3.bias")


def _update(declared: dict[str, object], dtype: type = np.float64) -> InterceptedUpdate:
    """A 6 x 5 first layer and a 4 x 6 next one, sent and received (with every array)."""
    rng = np.random.default_rng(0)
    sent = {
        LAYER[0]: rng.standard_normal((6, 5)),
        LAYER[1]: rng.standard_normal(6),
        NEXT[0]: rng.standard_normal((4, 6)),
        NEXT[1]: rng.standard_normal(4),
    }
    received = {k: (v - 0.01 * rng.standard_normal(v.shape)).astype(dtype) for k, v in sent.items()}
    return InterceptedUpdate(
        server_round=1,
        node_id=7,
        declared={"partition-id": 0, **declared},
        sent_weight=sent[LAYER[0]],
        sent_bias=sent[LAYER[1]],
        weight=received[LAYER[0]],
        bias=received[LAYER[1]],
        sent_arrays=sent,
        arrays=received,
    )


def _model(**knows: bool) -> ThreatModel:
    return ThreatModel(
        LAYER,
        knows_batch_size=knows.get("batch_size", False),
        knows_noise=knows.get("noise", True),
        next_layer=NEXT,
    )


DP_ONE_STEP = {"defence": "dp", "lr": 0.1, "steps": 1, "noise-std": 1e-4, "batch-size": 8}


def test_first_layer_is_the_update_over_the_learning_rate() -> None:
    update = _update({"defence": "fedsgd", "lr": 0.1, "steps": 1})
    sight = _model().of_update(update)
    w, b = LAYER
    expected = (update.sent_weight - update.weight) / 0.1
    assert np.allclose(sight.view.gradient[w], expected, rtol=1e-12, atol=0)
    assert np.array_equal(sight.view.weights[b], update.sent_bias)
    # One step: the next layer's gradient is of the same batch, and handed over too.
    assert set(sight.view.gradient) == {*LAYER, *NEXT} and sight.view.next_layer == NEXT
    assert sight.view.noise_std is None and sight.view.batch_size is None
    assert set(sight.knowledge) == {"lr", "batch_size", "noise", "next_layer"}
    assert sight.knowledge["batch_size"] == "estimated" and sight.knowledge["noise"] == "none"


def test_no_lr_declared_is_assumed_one() -> None:
    sight = _model().of_update(_update({"defence": "fedsgd"}))
    assert sight.knowledge["lr"] == "assumed 1"
    w = LAYER[0]
    update = _update({"defence": "fedsgd"})
    assert np.allclose(sight.view.gradient[w], update.sent_weight - update.weight)


@pytest.mark.parametrize("junk", ["fast", None, -1, 0, float("nan"), [1, 2]])
def test_what_a_users_app_declares_that_is_no_number_counts_as_unsaid(junk: object) -> None:
    declared = {"defence": "fedsgd", "lr": junk, "steps": junk, "batch-size": junk}
    sight = _model(batch_size=True).of_update(_update(declared))
    assert sight.knowledge["lr"] == "assumed 1" and sight.knowledge["batch_size"] == "estimated"
    assert sight.view.batch_size is None
    update = _update(declared)
    assert np.allclose(sight.view.gradient[LAYER[0]], update.sent_weight - update.weight)


def test_dp_noise_is_told_only_when_the_audit_knows_noise() -> None:
    """DP-SGD's declared per-step std, sqrt(steps) times over, and only with knows_noise."""
    declared = {**DP_ONE_STEP, "steps": 4}
    told = _model(noise=True).of_update(_update(declared))
    assert told.view.noise_std == pytest.approx(1e-4 * math.sqrt(4), rel=1e-12)
    assert told.knowledge["noise"] == "declared"
    blind = _model(noise=False).of_update(_update(declared))
    assert blind.view.noise_std is None and blind.knowledge["noise"] == NOISE_NOT_TOLD


def test_local_dp_noise_is_the_gaussian_mechanism_in_gradient_units() -> None:
    declared = {
        "defence": "fedsgd",
        "lr": 0.5,
        "steps": 1,
        "update-mods": ["local_dp"],
        "local-dp-sensitivity": 0.2,
        "local-dp-epsilon": 2.0,
        "local-dp-delta": 1e-5,
    }
    sight = _model().of_update(_update(declared))
    assert sight.view.noise_std == pytest.approx(gaussian_std(0.2, 2.0, 1e-5) / 0.5, rel=1e-12)


def test_batch_size_is_told_only_when_declared_and_known() -> None:
    assert _model(batch_size=True).of_update(_update(DP_ONE_STEP)).view.batch_size == 8
    assert _model(batch_size=False).of_update(_update(DP_ONE_STEP)).view.batch_size is None
    undeclared = {k: v for k, v in DP_ONE_STEP.items() if k != "batch-size"}
    sight = _model(batch_size=True).of_update(_update(undeclared))
    assert sight.view.batch_size is None and sight.knowledge["batch_size"] == "estimated"


def test_float32_rounding_floor_matches_the_measured_round_off() -> None:
    """The server's own estimate of the round-off float32 weights carry, against the actual
    error of rounding float64 weights to float32 (brute force, 200k entries)."""
    rng = np.random.default_rng(1)
    exact = rng.standard_normal(200_000)
    rounded = exact.astype(np.float32)
    measured = float(np.std(exact - rounded.astype(np.float64))) / 0.1
    assert rounding_noise(rounded, 0.1) == pytest.approx(measured, rel=0.02)
    assert rounding_noise(exact, 0.1) == 0.0  # float64: below the attack's own tolerance
    # Through the model, no defence noise: the floor alone, sqrt(steps) times over.
    update = _update({"defence": "fedavg", "lr": 0.1, "steps": 9}, dtype=np.float32)
    sight = _model().of_update(update)
    expected = rounding_noise(update.weight, 0.1) * 3
    assert sight.view.noise_std == pytest.approx(expected, rel=1e-12)
    assert sight.knowledge["noise"] == "rounding"
    noisy = _update(DP_ONE_STEP, dtype=np.float32)
    dp = _model().of_update(noisy)
    expected = math.hypot(1e-4, rounding_noise(noisy.weight, 0.1))
    assert dp.view.noise_std == pytest.approx(expected, rel=1e-12)
    assert dp.knowledge["noise"] == "declared + rounding"


def test_next_layer_only_for_one_step_kept_whole() -> None:
    one_step = _model().of_update(_update(DP_ONE_STEP))
    assert one_step.view.next_layer == NEXT and set(one_step.view.gradient) == {*LAYER, *NEXT}
    # The next layer's weight as sent too: it ties each sample's column to its output gradient
    # there (attacks.spearpp.coupled).
    assert set(one_step.view.weights) == {*LAYER, *NEXT}
    assert "next_layer" in one_step.knowledge
    several = _model().of_update(_update({**DP_ONE_STEP, "steps": 3}))
    assert several.view.next_layer is None and set(several.view.gradient) == set(LAYER)
    plain = _model().of_update(_update({"defence": "fedsgd", "lr": 0.1, "steps": 1}))
    assert plain.view.next_layer == NEXT
    fedavg = _model().of_update(_update({"defence": "fedavg", "lr": 0.1, "steps": 3}))
    assert fedavg.view.next_layer is None
    not_whole = dataclasses.replace(_update(DP_ONE_STEP), arrays=None, sent_arrays=None)
    assert _model().of_update(not_whole).view.next_layer is None


def test_whole_model_view_is_the_mean_step_with_pixel_bounds() -> None:
    net = fc_relu_net(width=6, depth=2, input_dim=5, num_classes=4)
    norm = Normalization((0.5,), (0.25,), ndim=3)
    image = DataDescription((1, 1, 5), 4, (0.0,), (255.0,), norm)
    model = dataclasses.replace(_model(), architecture=net, data=image)
    update = _update({"defence": "fedavg", "lr": 0.1, "steps": 4})
    sight = model.of_update(update, whole_model=True, labels=(1, 2))
    for k in update.whole()[0]:
        sent, received = update.whole()[0][k], update.whole()[1][k]
        assert np.allclose(sight.view.gradient[k], (sent - received) / (0.1 * 4), rtol=1e-12)
    assert sight.view.bounds == ((-2.0,), (2.0,)) and sight.view.labels == (1, 2)
    assert sight.view.input_shape == (1, 1, 5) and sight.knowledge["labels"] == "told"
    records = DataDescription(
        (5,), 4, (0.0,) * 5, (1.0,) * 5, Normalization((0.0,) * 5, (1.0,) * 5, 1)
    )
    tabular = dataclasses.replace(model, data=records).of_update(update, whole_model=True)
    assert tabular.view.bounds is None and tabular.knowledge["labels"] == "recovered"
    with pytest.raises(ValueError, match="architecture"):
        _model().of_update(update, whole_model=True)


def test_secagg_sum_is_one_batch_with_its_quantisation_noise() -> None:
    rng = np.random.default_rng(2)
    sent_w, sent_b = rng.standard_normal((6, 5)), rng.standard_normal(6)
    mean_w, mean_b = sent_w - 0.01, sent_b - 0.02
    declared = tuple({"partition-id": i, "lr": 0.2, "batch-size": 4} for i in range(3))
    aggregate = InterceptedAggregate(
        server_round=2,
        node_ids=(10, 11, 12),
        declared=declared,
        num_examples=(4, 4, 4),
        dropped=(),
        sent_weight=sent_w,
        sent_bias=sent_b,
        weight=mean_w,
        bias=mean_b,
        trained_at=None,
    )
    secagg = SecAggSpec()
    sight = _model(batch_size=True).of_aggregate(aggregate, secagg)
    assert np.allclose(sight.view.gradient[LAYER[0]], 0.01 / 0.2, rtol=1e-12)
    assert np.allclose(sight.view.gradient[LAYER[1]], 0.02 / 0.2, rtol=1e-12)
    quantisation = secagg_noise_std(
        (4, 4, 4), secagg.clipping_range, secagg.quantization_range, secagg.max_weight
    )
    assert sight.view.noise_std == pytest.approx(quantisation / 0.2, rel=1e-12)
    assert sight.view.batch_size == 12 and sight.knowledge["batch_size"] == "sum of the declared"
    assert sight.knowledge["noise"] == "SecAgg+ quantisation"
    assert sight.knowledge["view"].startswith("the SecAgg+ sum of 3 clients")
    blind = _model(noise=False).of_aggregate(aggregate, secagg)
    assert blind.view.noise_std is None and blind.view.batch_size is None
    # No one layer trained: the average of the sent ones, and the record says so.
    assert np.array_equal(sight.view.weights[LAYER[0]], sent_w)
    assert sight.knowledge["weights"].startswith("the average")


def test_secagg_sum_is_attacked_at_the_layer_the_live_clients_were_sent() -> None:
    # isolate: the target (weight 1 of 4) got the honest layer, the rest a dead one; the sent
    # average is no layer any sample saw, and its biases would mark most neurons inactive.
    rng = np.random.default_rng(5)
    honest_w, honest_b = rng.standard_normal((6, 5)), rng.standard_normal(6)
    sent_w, sent_b = honest_w / 4, honest_b / 4 - 0.75
    aggregate = InterceptedAggregate(
        server_round=2,
        node_ids=(10, 11, 12, 13),
        declared=tuple({"partition-id": i, "lr": 0.5} for i in range(4)),
        num_examples=(4, 4, 4, 4),
        dropped=(),
        sent_weight=sent_w,
        sent_bias=sent_b,
        weight=sent_w - 0.01,
        bias=sent_b - 0.02,
        trained_at=(honest_w, honest_b),
    )
    sight = _model().of_aggregate(aggregate, SecAggSpec())
    assert np.array_equal(sight.view.weights[LAYER[0]], honest_w)
    assert np.array_equal(sight.view.weights[LAYER[1]], honest_b)
    # The gradient is still the sum's: sent average minus aggregate, over lr.
    assert np.allclose(sight.view.gradient[LAYER[0]], 0.01 / 0.5, rtol=1e-12)
    assert sight.knowledge["weights"] == "the layer every client that could train was sent"


def test_secagg_sum_of_dp_clients_is_told_their_noise_in_gradient_units() -> None:
    # A DP client declares its noise per entry of the gradient (sigma C / B per step); the
    # quantisation's is per weight, so only it is divided by lr.
    rng = np.random.default_rng(3)
    sent_w, sent_b = rng.standard_normal((6, 5)), rng.standard_normal(6)
    declared = tuple(
        {"partition-id": i, "lr": 0.5, "batch-size": 4, "noise-std": 1e-3, "steps": 2}
        for i in range(2)
    )
    aggregate = InterceptedAggregate(
        server_round=1,
        node_ids=(10, 11),
        declared=declared,
        num_examples=(4, 4),
        dropped=(),
        sent_weight=sent_w,
        sent_bias=sent_b,
        weight=sent_w - 0.01,
        bias=sent_b - 0.01,
        trained_at=(sent_w, sent_b),
    )
    secagg = SecAggSpec()
    sight = _model(batch_size=True).of_aggregate(aggregate, secagg)
    quantisation = secagg_noise_std(
        (4, 4), secagg.clipping_range, secagg.quantization_range, secagg.max_weight
    )
    # Two clients of equal weight: the mean of two independent noises, each 1e-3 sqrt(2).
    dp = 1e-3 * math.sqrt(2) / math.sqrt(2)
    assert sight.view.noise_std == pytest.approx(math.hypot(quantisation / 0.5, dp), rel=1e-12)
    assert sight.knowledge["noise"] == "SecAgg+ quantisation + declared DP"


def test_a_sight_is_immutable() -> None:
    sight = _model().of_update(_update(DP_ONE_STEP))
    with pytest.raises(dataclasses.FrozenInstanceError):
        sight.knowledge = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        sight.knowledge["noise"] = "told"  # type: ignore[index]


def test_the_threat_model_reads_no_files_and_no_ground_truth() -> None:
    """Pure: none of the audit log's, the judge's, the run directory's or the data's modules,
    nor any file access, in the module."""
    tree = ast.parse(Path(threat_model.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    forbidden = {"fl_sim.audit.judge", "fl_sim.audit.log", "fl_sim.rundir", "fl_sim.data.federated"}
    assert imported and not imported & forbidden, imported & forbidden
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "open" not in names and not {"read_text", "write_text", "savez", "load"} & attrs
