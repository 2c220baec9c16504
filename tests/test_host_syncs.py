"""The search loops never wait on the device: no op that makes a GPU hand a value to the host.

A dispatch mode counts, on the CPU, the ops that would sync on CUDA: reading a scalar
(``item``, ``bool``, ``float``: ``_local_scalar_dense``), data-dependent shapes (``nonzero``,
``masked_select``, ``unique``, indexing by a boolean mask) and linear-algebra error checks
(``_linalg_check_errors``).
Checks inside a kernel (``torch.linalg.eigh``'s on CUDA) are not visible here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attacks import SpearConfig
from attacks.spearpp.factor import factorise
from attacks.spearpp.search import random_starts, run_search
from attacks.spearpp.signs import SignGeometry, fit_inputs, sign_search
from tests.helpers import observation

SYNCING = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "_unique2",
    "unique_consecutive",
    "_linalg_check_errors",
}

# Indexing by a boolean mask has a data-dependent shape too (a nonzero inside the op).
MASK_INDEXING = {"index", "index_put"}


class _SyncCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = func._overloadpacket.__name__
        if name in SYNCING:
            self.seen[name] += 1
        if name in MASK_INDEXING and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
        ):
            self.seen[name + "(mask)"] += 1
        return func(*args, **(kwargs or {}))


def _syncs(work: Callable[[], object]) -> Counter[str]:
    with _SyncCounter() as counter:
        work()
    return counter.seen


@pytest.fixture(scope="module")
def geometry() -> SignGeometry:
    view, _, _ = observation(20, 200, 0)
    fac = factorise(
        view["grad_weight"],
        batch_size=None,
        noise_std=None,
        precision=1e-9,
        generator=torch.Generator().manual_seed(0),
    )
    return SignGeometry.build(fac.left, fac.right, view["weight"], view["bias"])


def test_the_counter_sees_a_sync(geometry: SignGeometry) -> None:
    assert _syncs(lambda: float(geometry.left.sum()))["_local_scalar_dense"] == 1


def test_sign_search_iterations_never_sync(geometry: SignGeometry) -> None:
    """With inverse-iteration null steps (``eigh``'s error check runs inside the kernel: a sync
    on CUDA that the CPU does not show), and points kept to the end, as on a GPU."""
    starts = random_starts(8, geometry.left.shape[1], torch.Generator().manual_seed(0))
    found = geometry.to_search(torch.eye(20, dtype=torch.float64)[:3])
    deflation = torch.linalg.qr(found.T).Q  # B x F
    cases = ((None, 14, None, False), (None, 14, None, True), (deflation, 6, found, False))
    for defl, iterations, known, whole in cases:
        run = partial(
            sign_search,
            geometry,
            starts,
            defl,
            iterations,
            known,
            null_step="inverse",
            whole=whole,
            drop_fixed=False,
        )
        assert not _syncs(run)


def test_the_cpu_path_drops_points_the_gpu_path_keeps(geometry: SignGeometry) -> None:
    """The host round trips the CPU path takes are exactly the ones the GPU path avoids."""
    starts = random_starts(8, geometry.left.shape[1], torch.Generator().manual_seed(0))
    assert _syncs(lambda: sign_search(geometry, starts, None, 14))["index(mask)"]
    active = geometry.pre[:, :5].T > 0
    assert _syncs(lambda: fit_inputs(geometry.affine(), active))["_local_scalar_dense"]


def test_max_margin_newton_steps_never_sync(geometry: SignGeometry) -> None:
    active = geometry.pre[:, :5].T > 0
    assert not _syncs(lambda: fit_inputs(geometry.affine(), active, gather=False))


@pytest.mark.parametrize("optimiser", ["radam", "pgd"])
def test_surrogate_steps_never_sync(geometry: SignGeometry, optimiser: str) -> None:
    config = SpearConfig(optimiser=optimiser, steps=20, harvest_every=0)
    starts = random_starts(16, geometry.left.shape[1], torch.Generator().manual_seed(0))

    def never(points: torch.Tensor) -> torch.Tensor:
        raise AssertionError("no harvest was asked for")

    assert not _syncs(lambda: run_search(geometry.left, starts, config, never))
