"""SPEAR++'s peak memory, estimated before it runs, so an audit can schedule attacks by it.

A fit to peaks measured on the CPU (resident memory above an idle worker, float64 arrays of
CIFAR-10 updates, B = 100 to 512, m = 1,000 to 4,000; ``docs/audit.md``), rounded up: every
measured peak lies 8% to 31% below its estimate. Three parts:

- the arrays: the job's weights and gradient, a temporary while they are read, and the
  factorisation's copies (five m x n float64 arrays in all);
- the search, whose batched tensors grow as B^2 (about 1,000 float64 entries per B^2, the
  starts' rows and their Gram matrices) until chunking by ``max_elements`` caps them at six
  chunks' worth (saturated from B of about 300 on). Without the batch size, B is bounded by
  the gradient's rank, at most min(m, n).
"""

from __future__ import annotations

FLOAT64_BYTES = 8
ARRAY_COPIES = 5
SEARCH_BYTES_PER_SQUARED_COLUMN = 1_000 * FLOAT64_BYTES
SEARCH_CHUNKS = 6


def peak_bytes(width: int, inputs: int, batch_size: int | None, max_elements: int) -> int:
    """Estimated peak of one reconstruction above an idle worker's: ``width`` neurons (m),
    ``inputs`` per sample (n), the batch size if known (else its bound min(m, n)) and the
    engine's ``max_elements`` per chunk."""
    arrays = ARRAY_COPIES * width * inputs * FLOAT64_BYTES
    columns = min(width, inputs) if batch_size is None else batch_size
    cap = SEARCH_CHUNKS * max_elements * FLOAT64_BYTES
    return arrays + min(cap, SEARCH_BYTES_PER_SQUARED_COLUMN * columns**2)
