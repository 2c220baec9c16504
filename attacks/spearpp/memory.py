"""SPEAR++'s peak memory, estimated before it runs, so an audit can schedule attacks by it.

An upper bound built from the engine's largest allocations, its constants fitted to peaks
measured in the audit's own workers (``fl-sim bench memory``, the results row ``memory``):

- the engine's fixed footprint: its imports and the linear algebra's workspaces, 0.13 to 0.24 GB
  above an idle worker for a B=20, m=200 attack;
- the arrays: the job's weights and gradient, a temporary while they are read, and the
  factorisation's copies (five m x n float64 arrays in all);
- the sign search's batched rows and Gram matrices, which grow as B^2 (about 1,000 float64
  entries per B^2) until chunking by ``max_elements`` caps them at six chunks' worth;
- the max-margin fits of a complement round's candidate patterns (about 4 B of them at B=150,
  m=1000, 6 B at B=512, m=4000), one B x B Hessian each, chunked by
  :data:`~attacks.spearpp.signs.FIT_ELEMENTS` with several copies alive: at B=512, m=4000 they
  took the worker to 4.3 GB (seven copies counted, for a margin). The two stages do not overlap.

Without the batch size, B is bounded by the gradient's rank, at most min(m, n). The bound is
loose where the complement rounds never run (the sign search alone finds the batch).
"""

from __future__ import annotations

from attacks.spearpp.signs import FIT_ELEMENTS

FLOAT64_BYTES = 8
ENGINE_BYTES = 250_000_000
ARRAY_COPIES = 5
SEARCH_BYTES_PER_SQUARED_COLUMN = 1_000 * FLOAT64_BYTES
SEARCH_CHUNKS = 6
FIT_CANDIDATES_PER_COLUMN = 6
FIT_COPIES = 7


def peak_bytes(width: int, inputs: int, batch_size: int | None, max_elements: int) -> int:
    """Estimated peak of one reconstruction above an idle worker's: ``width`` neurons (m),
    ``inputs`` per sample (n), the batch size if known (else its bound min(m, n)) and the
    engine's ``max_elements`` per chunk."""
    arrays = ARRAY_COPIES * width * inputs * FLOAT64_BYTES
    columns = min(width, inputs) if batch_size is None else batch_size
    search = min(
        SEARCH_CHUNKS * max_elements * FLOAT64_BYTES,
        SEARCH_BYTES_PER_SQUARED_COLUMN * columns**2,
    )
    fits = FIT_COPIES * min(FIT_ELEMENTS, FIT_CANDIDATES_PER_COLUMN * columns**3) * FLOAT64_BYTES
    return ENGINE_BYTES + arrays + max(search, fits)
