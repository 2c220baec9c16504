"""Networks trained on a whole training split: trained once, cached, read back, attacked on
images they never saw."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from attacks import SpearConfig
from fl_sim.bench import attack, converge
from fl_sim.bench.attack import run_bench, run_case
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.converge import Convergence
from fl_sim.bench.pretrain import Pretraining
from fl_sim.bench.sweep import SweepPlan, combine_sweeps, network_label, run_sweep
from fl_sim.cli import main
from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization
from tests.helpers import SHARED_NPZ, real_images

SMALL = Convergence(epochs=4, batch_size=50)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "converged"
    monkeypatch.setattr(converge, "CACHE_DIR", where)
    return where


def _splits() -> tuple[ImageSet, ImageSet]:
    data = real_images()
    train = ImageSet(data.images[:800], data.labels[:800], "train")
    return train, ImageSet(data.images[800:], data.labels[800:], "test")


def test_a_network_is_trained_once_then_read_back(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train, test = _splits()
    first = SMALL.network(32, 3, 0, train, test, Normalization())
    # 800 images, 4 epochs: well past chance (0.1) on what it trained on.
    assert first.train_accuracy > 0.3 and 0 < first.test_accuracy < 1
    assert len(list(cache.glob("*.pt"))) == 1

    def refuse(*_: object) -> None:
        raise AssertionError("trained again where the cache holds the network")

    monkeypatch.setattr(Convergence, "_train", refuse)
    again = SMALL.network(32, 3, 0, train, test, Normalization())
    assert again.test_accuracy == first.test_accuracy
    assert all(torch.equal(again.state[k], v) for k, v in first.state.items())


def test_the_cache_tells_networks_apart(cache: Path) -> None:
    train, test = _splits()
    base = SMALL.network(16, 3, 0, train, test, Normalization())
    relabelled = ImageSet(train.images, np.roll(train.labels, 1), "train")
    others = [
        SMALL.network(16, 3, 1, train, test, Normalization()),
        replace(SMALL, lr=0.02).network(16, 3, 0, train, test, Normalization()),
        SMALL.network(16, 3, 0, relabelled, test, Normalization()),
    ]
    assert len(list(cache.glob("*.pt"))) == 4
    for other in others:
        assert not torch.equal(other.state["1.weight"], base.state["1.weight"])


@pytest.mark.parametrize(
    ("field", "value"), [("epochs", 0), ("lr", 0.0), ("momentum", 1.0), ("batch_size", 0)]
)
def test_bad_settings_are_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        Convergence(**{field: value})


def test_a_case_trains_one_way() -> None:
    with pytest.raises(ValueError, match="pretrain and converged"):
        AttackCase("both", 6, 80, pretrain=Pretraining(10), converged=SMALL)


def test_a_converged_case_needs_its_training_split() -> None:
    case = AttackCase("c", 6, 80, depth=3, converged=SMALL)
    with pytest.raises(ValueError, match="training split"):
        run_case(case, 0, real_images(), Normalization(), torch.float64)


def test_a_converged_network_is_attacked_on_unseen_images(tmp_path: Path) -> None:
    train, test = _splits()
    case = AttackCase(
        "converged", 6, 80, depth=3, attack=SpearConfig(starts=300, steps=400), converged=SMALL
    )
    (summary,) = run_bench([case], test, tmp_path / "out", train=train, command="test")
    (row,) = [
        json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()
    ]
    assert row["converged"]["epochs"] == SMALL.epochs and row["converged"]["train_accuracy"] > 0.3
    assert summary["network_accuracy_min"]["test"] == row["converged"]["test_accuracy"]
    assert "trained on the whole training split" in (tmp_path / "out" / "summary.md").read_text()
    # The trained weights are the ones attacked: B=6 at m=80 stays exact.
    assert summary["share_exact_samples"] == 1.0


def test_the_command_refuses_one_set_of_images() -> None:
    if not SHARED_NPZ.is_file():
        pytest.skip(f"{SHARED_NPZ} is not here")
    with pytest.raises(SystemExit, match="training split"):
        main(["bench", "attack", "--preset", "converged", "--data", str(SHARED_NPZ)])


def test_sweeps_of_converged_and_uncentred_networks_are_their_own_series(tmp_path: Path) -> None:
    train, test = _splits()
    converged = run_sweep(
        [SweepPlan(80, 6, 6, 6)],
        test,
        tmp_path / "converged",
        seeds=(0,),
        attack=SpearConfig(starts=300, steps=400),
        converged=SMALL,
        train=train,
        own_images=True,
    )
    own = [json.loads(line) for line in (tmp_path / "converged" / "rows.jsonl").open()]
    assert [r["converged"]["own_images"] for r in own] == [True]
    uncentred = run_sweep(
        [SweepPlan(100, 4, 4, 4)],
        test,
        tmp_path / "uncentred",
        seeds=(0,),
        attack=SpearConfig(starts=300, steps=400),
        centred=False,
    )
    assert converged == {80: 6} and uncentred == {100: 4}
    rows = [json.loads(line) for line in (tmp_path / "uncentred" / "rows.jsonl").open()]
    assert [r["centred"] for r in rows] == [False]
    joined = combine_sweeps([tmp_path / "uncentred", tmp_path / "converged"], tmp_path / "all")
    assert joined == {
        network_label(Pretraining(), SMALL, own_images=True): {80: 6},
        network_label(Pretraining(), centred=False): {100: 4},
    }
    assert "converged (4 epochs on the training split), its own training images" in joined
    assert (tmp_path / "all" / "limit.png").stat().st_size > 0


def test_own_images_are_drawn_from_the_training_split(monkeypatch: pytest.MonkeyPatch) -> None:
    train, test = _splits()
    drawn_from: list[str] = []
    real = attack.client_update

    def spy(case: AttackCase, seed: int, data: ImageSet, *args: object) -> object:
        drawn_from.append(data.source)
        return real(case, seed, data, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(attack, "client_update", spy)
    case = AttackCase(
        "own", 6, 80, depth=3, attack=SpearConfig(starts=300, steps=400), converged=SMALL
    )
    rows = [
        run_case(
            replace(case, own_images=own), 0, test, Normalization(), torch.float64, train=train
        )
        for own in (False, True)
    ]
    assert drawn_from == ["test", "train"]
    assert [r["converged"]["own_images"] for r in rows] == [False, True]
    assert all(r["share_exact"] == 1.0 for r in rows)
    with pytest.raises(ValueError, match="own_images"):
        AttackCase("own", 6, 80, own_images=True)


def test_a_converged_preset_takes_no_pretraining() -> None:
    with pytest.raises(SystemExit, match="pretrain and converged both train"):
        main(["bench", "attack", "--preset", "converged", "--pretrain-steps", "10", "--data", "x"])
