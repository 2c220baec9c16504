"""Attack executors: the local pool and Ray tasks report the same outcomes through callbacks,
map failures alike, drain on wait, and fire nothing after close."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from attacks import ATTACKS, ServerView, SpearConfig
from fl_sim.audit.job import AttackJob, AttackOutcome, write_arrays
from fl_sim.config import ClusterSpec
from fl_sim.executors import (
    EXECUTORS,
    AttackExecutor,
    PoolExecutor,
    RayExecutor,
)
from fl_sim.model import fc_relu_net, first_linear, layer_gradients

LOCAL = ClusterSpec(address="local")
LAYER = ("weight", "bias")


def _job(tmp: Path, client: int, batch: int = 4) -> tuple[AttackJob, torch.Tensor]:
    """A FedSGD update of a small network on random inputs, and those inputs."""
    torch.manual_seed(client)
    net = fc_relu_net(40, 3).double()
    x = torch.randn(batch, 3072, dtype=torch.float64)
    gw, gb = layer_gradients(net, x, torch.randint(0, 10, (batch,)))
    _, layer = first_linear(net)
    arrays = write_arrays(
        tmp / f"c{client}.npz",
        weights={"weight": layer.weight.detach().numpy(), "bias": layer.bias.detach().numpy()},
        gradient={"weight": gw.numpy(), "bias": gb.numpy()},
    )
    config = SpearConfig(starts=200, steps=200, max_passes=2, seed=client)
    job = AttackJob(
        1, client, "spearpp", ATTACKS["spearpp"], arrays, ServerView({}, {}, LAYER), config, 0
    )
    return job, x


class _Collector:
    """Callbacks that remember what came back, and from which thread."""

    def __init__(self) -> None:
        self.outcomes: dict[int, AttackOutcome] = {}
        self.errors: list[BaseException] = []
        self.threads: set[str] = set()

    def outcome(self, out: AttackOutcome) -> None:
        self.threads.add(threading.current_thread().name)
        self.outcomes[out.client] = out

    def error(self, err: BaseException) -> None:
        self.errors.append(err)


def _exercise(executor: AttackExecutor, tmp: Path) -> _Collector:
    """Two good jobs and one whose batch size is not a number; drained, then closed."""
    got = _Collector()
    truths = {}
    for client in (0, 1):
        job, truths[client] = _job(tmp, client)
        executor.submit(job, got.outcome, got.error)
    broken, _ = _job(tmp, 2)
    unusable = replace(broken, view=replace(broken.view, batch_size="three"))  # type: ignore[arg-type]
    executor.submit(unusable, got.outcome, got.error)
    assert executor.wait(120)
    executor.close()
    assert sorted(got.outcomes) == [0, 1]
    for client, x in truths.items():
        rec = torch.from_numpy(got.outcomes[client].inputs)  # type: ignore[arg-type]
        nearest = torch.cdist(x, rec).min(dim=1).values
        assert float(nearest.max()) < 1e-6, "reconstruction is not exact"
    assert len(got.errors) == 1 and isinstance(got.errors[0], TypeError)
    return got


def test_registry_names_pool_and_ray() -> None:
    assert set(EXECUTORS.names()) >= {"pool", "ray"}
    assert isinstance(EXECUTORS["pool"](1, LOCAL), PoolExecutor)
    assert isinstance(EXECUTORS["ray"](1, LOCAL), RayExecutor)
    with pytest.raises(ValueError, match=r"cluster\.attack_executor='k8s': allowed are pool, ray"):
        EXECUTORS.lookup("k8s")


def test_pool_executor(tmp_path: Path) -> None:
    _exercise(PoolExecutor(2, LOCAL), tmp_path)


def test_ray_without_a_fitting_node_fails_every_job_and_disconnects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import ray

    assert not ray.is_initialized()
    executor = RayExecutor(1, ClusterSpec(address="local", attack_resource="attack-gpu-node"))
    got = _Collector()
    for client in (0, 1):
        executor.submit(_job(tmp_path, client)[0], got.outcome, got.error)
    with caplog.at_level(logging.ERROR):
        assert executor.wait(60)
    executor.close()
    assert not got.outcomes and len(got.errors) == 2
    assert "no node of the Ray cluster offers {'attack-gpu-node': 1.0}" in str(got.errors[0])
    assert not ray.is_initialized()  # it connected (a local Ray), so it disconnected


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A private local Ray with 2 CPUs and one (pretended) GPU, as Flower's engine would have
    connected it; its processes end with ray.shutdown()."""
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=1,
        object_store_memory=100 * 2**20,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_executor_matches_the_pool(local_ray: None, tmp_path: Path) -> None:
    import ray

    got = _exercise(RayExecutor(2, LOCAL), tmp_path)
    assert got.threads == {"ray-attacks"}  # reported by the dispatcher as tasks finish
    assert ray.is_initialized()  # the connection it found is left to its owner


def test_ray_gpu_share_schedules_and_picks_the_device(local_ray: None, tmp_path: Path) -> None:
    """Two half-GPU tasks on the one GPU Ray was told of; on a machine without CUDA the
    engine's ``auto`` device then falls back to the CPU."""
    executor = RayExecutor(2, ClusterSpec(address="local", attack_gpus=0.5))
    got = _Collector()
    for client in (0, 1):
        executor.submit(_job(tmp_path, client)[0], got.outcome, got.error)
    assert executor.wait(120)
    executor.close()
    assert not got.errors and sorted(got.outcomes) == [0, 1]
    want = "cuda" if torch.cuda.is_available() else "cpu"
    devices = {o.summary["settings"]["device_used"] for o in got.outcomes.values()}
    assert {d.split(":")[0] for d in devices} == {want}


def test_ray_close_drops_unfinished_work(local_ray: None, tmp_path: Path) -> None:
    executor = RayExecutor(1, LOCAL)
    got = _Collector()
    job, _ = _job(tmp_path, 0, batch=30)
    slow = replace(job, config=job.config.replace(starts=20000, steps=20000, max_passes=50))
    calls: list[Any] = []
    executor.submit(slow, calls.append, calls.append)
    executor.submit(_job(tmp_path, 1)[0], got.outcome, got.error)
    assert not executor.wait(0.5)
    executor.close()
    assert not calls and not got.outcomes and not got.errors


def test_a_refused_job_keeps_the_batch_size_it_estimated(tmp_path: Path) -> None:
    job, _ = _job(tmp_path, 0, batch=60)  # 60 samples on 40 neurons: the gradient is full rank
    out = job.execute()
    assert out.inputs is None and str(out.error).startswith("refused: estimated batch size")
    assert out.summary == {"batch_size_estimated": 40}
