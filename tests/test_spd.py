"""Batched SPD solves: right, and alive where torch.linalg.solve's batched LU hangs (order 150,
after torch.set_num_threads(2), as the pool's workers call it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from attacks.spearpp.spd import solve_spd

_CHILD = """
import torch
from attacks.spearpp.spd import solve_spd
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
a = torch.randn(4, 150, 150, generator=g, dtype=torch.float64)
a = a @ a.transpose(1, 2) + torch.eye(150, dtype=torch.float64)
b = torch.randn(4, 150, 300, generator=g, dtype=torch.float64)
print(float((a @ solve_spd(a, b) - b).abs().max()))
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_solves_spd_batches_and_semidefinite_ones(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(3, 40, 40, generator=g, dtype=torch.float64)
    a = a @ a.transpose(1, 2) + 1e-3 * torch.eye(40, dtype=torch.float64)
    b = torch.randn(3, 40, 7, generator=g, dtype=torch.float64)
    torch.testing.assert_close(a @ solve_spd(a, b), b, rtol=0, atol=1e-8)
    # Rank 10 of 40 with a consistent right-hand side: least squares.
    low = torch.randn(3, 40, 10, generator=g, dtype=torch.float64)
    singular = low @ low.transpose(1, 2)
    rhs = singular @ torch.randn(3, 40, 2, generator=g, dtype=torch.float64)
    torch.testing.assert_close(singular @ solve_spd(singular, rhs), rhs, rtol=0, atol=1e-8)


def test_alive_after_set_num_threads_two() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, check=True
    )
    assert float(done.stdout.strip()) < 1e-8
    assert "MKL ERROR" not in done.stdout + done.stderr
