"""Steps 3-4: turning points where the search stopped into verified columns of Q.

A true column q_i makes L q_i the gradient of one sample at the layer's output, exactly zero on
the neurons that sample leaves inactive (about half). Exactness is therefore checkable: the
smallest rows of L q_i, more of them than B - 1, must have a common null direction. A point
whose small rows have a null space of dimension k > 1 sits on a face shared by k columns (a mix);
it is split by sampling inside that small null space.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attacks.spearpp.zero_rule import ZeroRule, zero_mask

# Number of a candidate's smallest rows used to pin its direction: B - 1 pin it, the rest
# over-determine it, so a wrong direction cannot pass by chance.
_EXTRA_ROWS_SHARE = 0.25
_EXTRA_ROWS_MIN = 4
_CHUNK = 256
_MAX_MIX = 4
# Zeros end at a jump of |L q| this large (log scale, e^3 = 20x): a true column's zeros sit
# many orders below its entries, an unconverged point shows no such jump.
_ZERO_JUMP = 3.0
# Past m - m/8 rows the jump must be e^15 (3e6).
_SPARSE_JUMP = 15.0
# Rows of L this small next to the largest belong to neurons no sample activates.
_DEAD_ROW = 1e-9
# Row subsets tried per mix (all of them when there are fewer), and the sparsest new
# directions they pin that go on to certification, per dimension of the mix.
_SPLIT_SUBSETS = 4096
_SPLIT_KEEP = 2
_NOISY_DRAWS = 8
# Mixes split per call: the rest are dropped (they recur if they matter).
_SPLIT_MAX = 32


def zero_split(size: torch.Tensor, floor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each point's zeros end: a threshold on ``size`` = |L q| (K x m), K x 1, and
    whether it sits at a jump (K).

    A point near a true column has exact zeros on its sample's inactive rows, far below its
    active entries: the split is at the largest jump of the sorted log sizes (at least
    ``floor`` rows from either end). Elsewhere no jump stands out and the split is at the
    median. A fixed share would mislabel every sample that leaves more or fewer than half its
    neurons inactive, and trained networks' samples range from a third to two thirds.
    """
    m = size.shape[1]
    lo = min(max(floor, m // 8), m // 2 - 1)
    # Exact zeros (rows of neurons no sample activates) sort with the smallest nonzero sizes:
    # their log would make a jump of its own.
    smallest = size.masked_fill(size <= 0, torch.inf).amin(dim=1, keepdim=True)
    ordered = torch.where(size <= 0, smallest, size).sort(dim=1).values
    logs = ordered.clamp_min(torch.finfo(size.dtype).tiny).log()
    # Jumps after rows lo .. m - lo - 2, then up to the last row: a sample active on fewer than
    # m / 8 neurons (a layer whose biases were shifted to fire each neuron for a tenth of the
    # samples; some samples fired one or two of 300) has its jump there, and only a jump as
    # large as a converged column's (round-off against its entries) counts there.
    jumps = logs[:, lo + 1 :] - logs[:, lo:-1]
    inner = m - 2 * lo - 1
    sparse = jumps[:, inner:] - (_SPARSE_JUMP - _ZERO_JUMP)
    best, where = torch.cat([jumps[:, :inner], sparse], dim=1).max(dim=1)
    at = (where + lo)[:, None]
    split = (ordered.gather(1, at) * ordered.gather(1, at + 1)).sqrt()
    jumped = best > _ZERO_JUMP
    median = size.median(dim=1, keepdim=True).values
    return torch.where(jumped[:, None], split, median), jumped


def pin_rows(batch_size: int) -> int:
    """Rows whose common null direction pins and certifies one column."""
    extra = max(_EXTRA_ROWS_MIN, math.ceil(_EXTRA_ROWS_SHARE * (batch_size - 1)))
    return batch_size - 1 + extra


@dataclass(frozen=True)
class Candidates:
    """Directions proposed as columns of Q, each with how well it was verified.

    Attributes
    ----------
    directions
        c x B unit vectors, sign fixed so the largest entry is positive.
    zeros
        Number of zero entries of L q under the zero rule.
    verified
        True where the direction is certified as one column.
    mixed
        True where the direction's zero set is shared by several columns (null space > 1).
    """

    directions: torch.Tensor
    zeros: torch.Tensor
    verified: torch.Tensor
    mixed: torch.Tensor

    def demote(self, keep: torch.Tensor) -> Candidates:
        """The same candidates, verified only where also ``keep``."""
        return Candidates(self.directions, self.zeros, self.verified & keep, self.mixed)

    @staticmethod
    def empty(dim: int, device: torch.device) -> Candidates:
        """No candidates."""
        none = torch.zeros(0, dtype=torch.bool, device=device)
        return Candidates(
            torch.zeros(0, dim, dtype=torch.float64, device=device),
            torch.zeros(0, dtype=torch.long, device=device),
            none,
            none,
        )

    @staticmethod
    def concat(parts: list[Candidates], dim: int, device: torch.device) -> Candidates:
        """All candidates of ``parts`` in order."""
        if not parts:
            return Candidates.empty(dim, device)
        return Candidates(
            torch.cat([p.directions for p in parts]),
            torch.cat([p.zeros for p in parts]),
            torch.cat([p.verified for p in parts]),
            torch.cat([p.mixed for p in parts]),
        )


def canonical_sign(q: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit norm with their largest-magnitude entry positive."""
    q = q / q.norm(dim=1, keepdim=True)
    pivot = q.gather(1, q.abs().argmax(dim=1, keepdim=True))
    return q * torch.sign(pivot)


def _count_zeros(left: torch.Tensor, q: torch.Tensor, rule: ZeroRule) -> torch.Tensor:
    return zero_mask(left, q, rule).sum(dim=1)


# A row whose leverage in the zero set's row space is this close to 1 is essential: without it
# the null space grows, so the direction is a mix pinned by an accidental cancellation.
_ESSENTIAL_LEVERAGE = 1 - 1e-6
# Eigenvalues of a zero set's Gram matrix below this share of the largest are null.
_NULL_EIGEN = 1e-12
_CERTIFY_ELEMENTS = 20_000_000
# Rows per column on which a zero set is checked first (see _certify).
_FIRST_ROWS_PER_COLUMN = 3


def _null_threshold(
    gram_eigs: torch.Tensor, entry_tol: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Eigenvalue under which a zero set's Gram matrix is null: round-off or the noise floor."""
    return torch.maximum(_NULL_EIGEN * gram_eigs[:, -1], 4 * entry_tol.square() * rows)


def _zero_rows(zero: torch.Tensor, most: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each direction's zero rows (c x k indices, padded) and which are real (c x k); with
    ``most``, only the first ``most`` of them by index."""
    take = zero if most is None else zero & (zero.cumsum(dim=1) <= most)
    count = max(1, int(take.sum(dim=1).max())) if take.shape[0] else 1
    real, idx = take.to(torch.float32).topk(count, dim=1)
    return idx, real > 0


def _null_and_leverage(
    left: torch.Tensor,
    v: torch.Tensor,
    idx: torch.Tensor,
    real: torch.Tensor,
    threshold: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the rows ``idx`` (c x k, ``real`` the ones that count) projected off each unit
    ``v``: whether a second null direction exists (eigenvalue under ``threshold`` of the
    ascending eigenvalues), each row's essential flag (c x k) and the eigenvectors."""
    b = v.shape[1]
    proj = torch.eye(b, dtype=v.dtype, device=v.device) - v[:, :, None] * v[:, None, :]
    y = (left[idx] * real[:, :, None]) @ proj  # c x k x B
    eigs, vecs = torch.linalg.eigh(y.transpose(1, 2) @ y)  # ascending; eigs[:, 0] is v's
    thr = threshold(eigs)
    second_null = eigs[:, 1] <= thr
    safe = torch.where(eigs[:, 1:] > thr[:, None], eigs[:, 1:], torch.inf)
    leverage = ((y @ vecs[:, :, 1:]).square() / safe[:, None, :]).sum(dim=2)
    return second_null, (leverage > _ESSENTIAL_LEVERAGE) & real, vecs


def _certify(
    left: torch.Tensor, v: torch.Tensor, zero: torch.Tensor, entry_tol: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Is each unit ``v`` exactly one column? Returns that mask and, for mixes, a null basis.

    A column's zero set S_i (about m/2 rows) spans B - 1 dimensions robustly. A mix of k columns
    is zero on their shared zero set, whose rows span only B - k dimensions, plus k - 1 rows where
    the columns happen to cancel: those rows are essential (leverage 1). So v is one column iff
    its zero set has a 1-D null space with no essential row.

    Each zero set is first checked on its first ``_FIRST_ROWS_PER_COLUMN`` x B rows: adding
    rows only shrinks the null space and every row's leverage (the Gram matrix grows), so a set
    that passes there passes in full (its threshold taken at least as high as the whole set's:
    the trace bounds the largest eigenvalue). The others are checked on all their rows.
    """
    c, b = v.shape
    rows = zero.sum(dim=1)
    # trace(P G P) over the whole zero set: sum of |P r_j|^2 = |r_j|^2 - (r_j . v)^2.
    trace = ((left.square().sum(dim=1) - (v @ left.T).square()) * zero).sum(dim=1)
    floor = 4 * entry_tol.square() * rows
    idx, real = _zero_rows(zero, _FIRST_ROWS_PER_COLUMN * b)
    second_null, essential, _ = _null_and_leverage(
        left, v, idx, real, lambda eigs: torch.maximum(_NULL_EIGEN * trace, floor)
    )
    one_column = ~second_null & ~essential.any(dim=1)
    bases: list[torch.Tensor | None] = [None] * c
    doubt = torch.nonzero(~one_column).flatten()
    if not doubt.numel():
        return one_column, bases
    idx, real = _zero_rows(zero[doubt])
    second_null, essential_rows, _ = _null_and_leverage(
        left,
        v[doubt],
        idx,
        real,
        lambda eigs: _null_threshold(eigs, entry_tol[doubt], rows[doubt]),
    )
    essential = torch.zeros_like(zero[doubt]).scatter_(1, idx, essential_rows)
    one_column[doubt] = ~second_null & ~essential.any(dim=1)
    for j, i in enumerate(doubt.tolist()):
        if one_column[i]:
            continue
        keep = zero[i] & ~essential[j]
        sub = left[keep]
        e, vec = torch.linalg.eigh(sub.T @ sub)
        k = int((e <= _null_threshold(e[None], entry_tol[i : i + 1], keep.sum()[None])).sum())
        bases[i] = vec[:, :k] if 2 <= k <= _MAX_MIX else None
    return one_column, bases


def novel(directions: torch.Tensor, known: torch.Tensor, cosine: float) -> torch.Tensor:
    """Mask of unit ``directions`` that are neither near a ``known`` column nor an earlier row."""
    near_known = torch.zeros(directions.shape[0], dtype=torch.bool, device=directions.device)
    if known.shape[0]:
        near_known = (directions @ known.T).abs().amax(dim=1) >= cosine
    same = (directions @ directions.T).abs() >= cosine
    return ~near_known & ~torch.tril(same, diagonal=-1).any(dim=1)


def _refit(
    left: torch.Tensor, zero: torch.Tensor, rule: ZeroRule
) -> tuple[torch.Tensor, torch.Tensor]:
    """Under noise, re-estimate each direction from its whole zero set (least squares over ~m/2
    rows instead of the pinned few), and recount its zeros."""
    gram = torch.einsum("mb,cm,md->cbd", left, zero.to(left.dtype), left)
    _, vecs = torch.linalg.eigh(gram)
    v = canonical_sign(vecs[:, :, 0])
    return v, _count_zeros(left, v, rule)


def _check(
    left: torch.Tensor, v: torch.Tensor, residual: torch.Tensor, rows: int, rule: ZeroRule
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
    """For unit ``v`` (c x B) with ``residual`` the smallest singular value of its pinning
    rows: whether those rows pin it, its zero set, whether it is one column, and mixes' bases."""
    yv = v @ left.T
    entry_tol = rule.tolerance(v, yv)
    pinned = residual <= entry_tol * math.sqrt(rows)
    zero = yv.abs() <= entry_tol[:, None]
    one_column, bases = _certify(left, v, zero, entry_tol)
    return pinned, zero, one_column, bases


def refine_kernel(
    left: torch.Tensor,
    points: torch.Tensor,
    rule: ZeroRule,
    split: bool,
    generator: torch.Generator,
    known: torch.Tensor,
    seen_mixes: set[bytes] | None = None,
) -> Candidates:
    """Replace each point by the null direction of its smallest rows and certify the new ones.

    Parameters
    ----------
    left
        The m x B factor, float64.
    points
        c x B directions (any scale).
    rule
        The zero tolerance.
    split
        Split mixes of a few columns into those columns.
    generator
        Random row draws for the splitting.
    known
        Columns already found (unit rows): points that land on them are dropped uncertified,
        since certification is the costly part.
    seen_mixes
        Zero sets of mixes split before (kept by the caller across calls): a mix is split once.
    """
    m, b = left.shape
    rows = min(pin_rows(b), m)
    chunk = max(1, _CERTIFY_ELEMENTS // (m * b))
    # Neurons no sample activates are zero in every direction: they cannot pin one (with small
    # B they are many, 1 in 2^B).
    row_norms = left.norm(dim=1)
    dead = row_norms <= _DEAD_ROW * row_norms.max()
    parts: list[Candidates] = []
    for block in points.split(chunk):
        y = block.to(torch.float64) @ left.T
        size = (y.abs() / row_norms).masked_fill(dead, torch.inf)
        idx = size.argsort(dim=1)[:, :rows]
        _, s, vh = torch.linalg.svd(left[idx], full_matrices=False)
        v = canonical_sign(vh[:, -1, :])
        keep = novel(v, known, rule.same_column_cosine)
        v, s, size = v[keep], s[keep], size[keep]
        pinned, zero, one_column, bases = _check(left, v, s[:, -1], rows, rule)
        # On trained networks many zero rows belong to neurons that only a few samples
        # activate, so a point's few smallest rows may not pin it; a converged point's whole
        # zero set (up to the jump in its sorted sizes) then does. Dead rows sort with the
        # smallest (their gradient is zero in every direction), so they make no jump of their
        # own. Under noise a jump does not mark a zero set (measured: mixes passed), so the
        # pinned rows alone decide there.
        threshold, jumped = zero_split(torch.where(dead, size.amin(dim=1, keepdim=True), size), b)
        redo = jumped & ~(pinned & one_column) & (not rule.noise_std)
        if bool(redo.any()):
            below = (size[redo] < threshold[redo]).to(left.dtype)
            gram = torch.einsum("mb,cm,md->cbd", left, below, left)
            w = canonical_sign(torch.linalg.eigh(gram)[1][:, :, 0])
            w_pinned, w_zero, w_one, w_bases = _check(
                left, w, torch.zeros_like(w[:, 0]), rows, rule
            )
            better = w_pinned & w_one
            where = torch.nonzero(redo).flatten()[better]
            v[where], zero[where], pinned[where], one_column[where] = (
                w[better],
                w_zero[better],
                w_pinned[better],
                w_one[better],
            )
            for i, j in zip(where.tolist(), torch.nonzero(better).flatten().tolist(), strict=True):
                bases[i] = w_bases[j]
        zeros = zero.sum(dim=1)
        verified = pinned & one_column & (zeros >= rows)
        if rule.noise_std and bool(verified.any()):
            v[verified], zeros[verified] = _refit(left, zero[verified], rule)
        mixed = pinned & ~one_column
        parts.append(Candidates(v, zeros, verified, mixed))
        if split:
            mixes = []
            for i in torch.nonzero(mixed).flatten().tolist():
                key = zero[i].cpu().numpy().tobytes()
                if bases[i] is not None and (seen_mixes is None or key not in seen_mixes):
                    mixes.append(bases[i])
                    if seen_mixes is not None:
                        seen_mixes.add(key)
            parts.append(_split_mixes(left, mixes[:_SPLIT_MAX], rule, generator, known))
    return Candidates.concat(parts, b, left.device)


def _row_subsets(outside: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """Subsets of ``size`` distinct rows out of ``outside`` (rows x size): every one when there
    are at most ``_SPLIT_SUBSETS``, else that many random draws."""
    if size == 1:
        return torch.arange(outside)[:, None]
    if math.comb(outside, size) <= _SPLIT_SUBSETS:
        return torch.combinations(torch.arange(outside), size)
    # (A draw that repeats a row pins nothing and is outranked.)
    return torch.randint(0, outside, (_SPLIT_SUBSETS, size), generator=generator)


def _split_mixes(
    left: torch.Tensor,
    bases: list[torch.Tensor],
    rule: ZeroRule,
    generator: torch.Generator,
    known: torch.Tensor,
) -> Candidates:
    """Columns hidden in the small null spaces of mixes.

    Inside a k-dimensional null space N, each column q_i = N c_i is zero on the rows of its own
    zero set outside the shared one, and k - 1 of them pin c_i. Such rows can be few (on trained
    networks a sample may be active on only one or two rows where a sparser one is not), so
    every (k - 1)-subset of the rows outside is tried where they are not too many, the
    directions they pin ranked by their zeros, and the sparsest new ones certified.
    """
    proposals = []
    for basis in bases:
        k = basis.shape[1]
        image = left @ basis  # m x k
        norms = image.norm(dim=1)
        outside = torch.nonzero(norms > 1e-6 * norms.max()).flatten()
        if outside.numel() < k - 1:
            continue
        if rule.noise_std:
            # Under noise every subset's direction is off by the noise, and ranking many by
            # their noise-level zeros let mixes through (measured: DP sigma=1e-4 fell below
            # 90% near-exact); a few random draws, all certified, did not.
            draws = torch.randint(0, outside.numel(), (_NOISY_DRAWS, k - 1), generator=generator)
            rows = image[outside[draws.to(outside.device)]]
            _, _, c_vh = torch.linalg.svd(rows, full_matrices=True)
            proposals.extend(c_vh[:, -1, :] @ basis.T)
            continue
        subsets = _row_subsets(outside.numel(), k - 1, generator).to(outside.device)
        _, _, c_vh = torch.linalg.svd(image[outside[subsets]], full_matrices=True)
        c = c_vh[:, -1, :]
        q = c @ basis.T  # unit: the basis is orthonormal
        # Zeros counted in the mix's own k coordinates: L q = (L N) c.
        y = c @ image.T
        zeros = (y.abs() <= rule.tolerance(q, y)[:, None]).sum(dim=1).to(left.dtype)
        if known.shape[0]:
            near = (q @ known.T).abs().amax(dim=1) >= rule.same_column_cosine
            zeros = zeros.masked_fill(near, -1)
        for _ in range(min(_SPLIT_KEEP * k, q.shape[0])):
            best = int(zeros.argmax())
            if zeros[best] < 0:
                break
            proposals.append(canonical_sign(q[best : best + 1])[0])
            zeros = zeros.masked_fill((q @ q[best]).abs() >= rule.same_column_cosine, -1)
    if not proposals:
        return Candidates.empty(left.shape[1], left.device)
    return refine_kernel(left, torch.stack(proposals), rule, False, generator, known)


def refine_sampling(
    left: torch.Tensor,
    points: torch.Tensor,
    rule: ZeroRule,
    samples: int,
    generator: torch.Generator,
    known: torch.Tensor,
) -> Candidates:
    """The paper's rounding: kernels of random (B - 1)-row subsets of each point's smallest rows.

    Of ``samples`` draws per point the kernel with the most zeros goes on to the same
    certification as :func:`refine_kernel` (so a mix never passes as a column).
    """
    m, b = left.shape
    pool = min(m, 2 * (b - 1) if b > 1 else 1)
    best: list[torch.Tensor] = []
    for chunk in points.split(max(1, _CHUNK // samples)):
        chunk = chunk.to(torch.float64)
        idx = (chunk @ left.T).abs().argsort(dim=1)[:, :pool]  # c x pool
        order = torch.rand(chunk.shape[0], samples, pool, generator=generator).argsort(dim=2)
        rows = idx.gather(1, order[:, :, : b - 1].reshape(chunk.shape[0], -1).to(idx.device))
        sub = left[rows].reshape(chunk.shape[0] * samples, b - 1, b)
        _, _, vh = torch.linalg.svd(sub, full_matrices=True)
        v = canonical_sign(vh[:, -1, :])
        zeros = _count_zeros(left, v, rule).reshape(chunk.shape[0], samples)
        pick = zeros.argmax(dim=1)
        best.append(v.reshape(chunk.shape[0], samples, b)[torch.arange(chunk.shape[0]), pick])
    if not best:
        return Candidates.empty(b, left.device)
    return refine_kernel(left, torch.cat(best), rule, False, generator, known)


# The paper keeps an l1 point as a column when enough of L q is this small relative to its max.
PAPER_SPARSE_TOL = 1e-3


def refine_none(left: torch.Tensor, points: torch.Tensor) -> Candidates:
    """Take points as they are (the paper's l1 path): accepted when at least ``pin_rows(B)``
    entries of L q are below ``PAPER_SPARSE_TOL`` of the largest. This is the paper's filter,
    not a certificate: the result's PSNR, not its status, tells whether it was exact."""
    v = canonical_sign(points.to(torch.float64))
    y = (v @ left.T).abs()
    zeros = (y <= PAPER_SPARSE_TOL * y.amax(dim=1, keepdim=True)).sum(dim=1)
    verified = zeros >= min(pin_rows(left.shape[1]), left.shape[0])
    return Candidates(v, zeros, verified, torch.zeros_like(verified))


# (left, points, rule, generator, known columns) -> candidates
Refiner = Callable[
    [torch.Tensor, torch.Tensor, ZeroRule, torch.Generator, torch.Tensor], Candidates
]


def refiner(
    name: str, rounding_samples: int, split: bool, seen_mixes: set[bytes] | None = None
) -> Refiner:
    """The refinement called ``name`` (``kernel``, ``sampling`` or ``none``)."""
    table: dict[str, Refiner] = {
        "kernel": lambda L, p, r, g, k: refine_kernel(L, p, r, split, g, k, seen_mixes),
        "sampling": lambda L, p, r, g, k: refine_sampling(L, p, r, rounding_samples, g, k),
        "none": lambda L, p, r, g, k: refine_none(L, p),
    }
    return table[name]
