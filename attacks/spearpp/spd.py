"""Batched solves of symmetric positive definite systems, without batched LU.

torch.linalg.solve (and inv) on a batch of matrices of order ~150 or more goes through MKL's
batched LU, which fails ("Parameter 6 was incorrect on entry to DLASWP") and then hangs once
``torch.set_num_threads`` was called with 2 threads, as fl-sim's pool workers do (torch 2.14.1,
measured here; order 60 and single matrices are unaffected). Cholesky and least squares are not.
"""

from __future__ import annotations

import torch


def solve_spd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """X with A X = B for a batch of symmetric positive definite A (... x n x n); where some A
    is not numerically positive definite, the batch is solved by least squares instead."""
    factor, info = torch.linalg.cholesky_ex(a)
    if bool(info.any()):
        solution: torch.Tensor = torch.linalg.lstsq(a, b).solution
        return solution
    return torch.cholesky_solve(b, factor)
