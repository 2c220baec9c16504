"""Coupled search: a sample's first-layer column tied to the next layer's output gradients.

In one step, sample i's output gradient at the first layer is g_i = D_i W'^T e_i: e_i, its
output gradient at the next layer (weight W'), lies in the column space C of that layer's
weight gradient, and D_i is its activity pattern. So with K = W'^T C every neuron j gives an
equation for the pair (q, d) of the sample's column and its coordinates in C:

- inactive (j a zero of the sample): L_j q = 0;
- active: L_j q = K_j d.

The sign search uses the first kind only. A mix of two samples' columns keeps the zeros the two
share (a quarter of the neurons at initialisation, more where patterns are shared: [0, 1]
pixels, trained networks), which is why mixes stay nearly as sparse as columns at large B;
here it also fails the second kind wherever one sample is active and the other is not, about
half the neurons. The iteration per point:

- labels: inactive where |L q| < |L q - K d| (at the first iteration, below its median);
- for the first :data:`PROJECTED` iterations the labels are projected onto the halfspace
  patterns as the sign search's are, and only the rows they put most clearly on either side
  are kept (the projection pulls points across the sphere; the plain labels converge locally);
- q: the smallest eigenvector of L_Z^T L_Z + L_S^T (I - P) L_S, P the projection onto K_S's
  range (d eliminated by least squares), and d from it.

Measured (judge's view, m=1000 at initialisation, 20 random starts each): B=175, 19 land on
a column (12 distinct) where the sign search lands 1 of 350; B=200, 15 (6 distinct) with 150
projected iterations. Inside the engine's rounds: m=1000, B=175 exact in 71 s (the sign
rounds alone: 1 of 175 columns in 300 s); [0, 1] pixels, m=1000, B=150, 52 s (1 of 150 in
600 s); m=200, B=50 and [0, 1] B=40, the seeds the sweeps missed, 2 s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from attacks.spearpp.gather import masked_rows
from attacks.spearpp.hidden import NextBases, next_layer_bases
from attacks.spearpp.inputs import NextLayer
from attacks.spearpp.signs import SignGeometry, input_space
from attacks.spearpp.spd import solve_spd

# Iterations per point, and how many of the first project their labels onto halfspace
# patterns. At m=1000, B=175 (20 random starts): 10 projected of 30, no column; 35 of 50, 10;
# 50 of 65, 14; 80 of 95, 19. At B=200, 80 of 95 gave 8 and 150 of 165 15.
ITERATIONS = 95
PROJECTED = 80
# Share of the rows the projected labels keep on each side (0.25: fewer columns; 0.45 too).
_SIDE = 0.35
# Ridge of K_S^T K_S, relative to K's scale (K is scaled to unit mean square singular value).
_RIDGE = 1e-12
# Gap between the next layer's B-th and (B + 1)-th singular values above which K is used: the
# search only proposes points, certified apart, so a K as far off as noise leaves it serves.
# A float32 client's round-off leaves gaps of 527, 191, 105 and 91 at (m, B) = (200, 20),
# (1000, 100), (1000, 150), (4000, 256) (RANK_GAP, for exact rank, turned them all away); at
# m=1000, B=150 the coupled points landed on true columns 16 times of 16 (11 distinct). A
# two-step update of un-centred inputs: a gap of 1.1.
COUPLING_GAP = 10.0
# Directions beside each point's own in the block inverse iteration of its eigenvector, the
# iteration's solves, and the shift of the Cholesky factor in units of the precision's epsilon
# times the mean diagonal (the matrices are Schur complements, PSD only up to round-off).
_RITZ_BLOCK = 7
_RITZ_SOLVES = 4
_RITZ_SHIFT = 10.0
# Elements of the per-point m x B products held at once.
_CHUNK_ELEMENTS = 1 << 25


class Coupling(NamedTuple):
    """What ties a sample's column to its output gradient at the next layer, on the rows of a
    view: K = W'^T C (``k``, m x B, scaled to unit mean square singular value), C an orthonormal
    basis of the next layer's output gradients e_i = C d_i, and T = G'^T C (``hidden_map``,
    m x B), G' that layer's weight gradient.

    G' = sum_i e_i h_i^T with h_i the samples' hidden vectors, so T = H D^T and each h_j is
    T f_j, f_j the j-th row of D^-1: f_j^T d_i = 0 for every other sample. A found sample's
    exact hidden vector thus confines every missing sample's d to the complement of its f_j,
    as its input confines their columns (P Q = I).
    """

    k: torch.Tensor
    hidden_map: torch.Tensor
    # The precision of its search (coupled_search's dtype; search_signs sets it per layer).
    dtype: torch.dtype | None = None

    def on_rows(self, rows: torch.Tensor) -> Coupling:
        """The same coupling on the neurons ``rows`` selects."""
        return Coupling(self.k[rows], self.hidden_map[rows], self.dtype)

    def deflated(self, hidden: torch.Tensor) -> torch.Tensor:
        """K on the coordinates of d left to the missing samples (m x (B - F)), given the found
        samples' exact hidden vectors (F x m, on this coupling's rows)."""
        if not hidden.shape[0]:
            return self.k
        duals = torch.linalg.lstsq(self.hidden_map, hidden.T).solution  # B x F: the f_j
        outside = torch.linalg.svd(duals, full_matrices=True)[0][:, duals.shape[1] :]
        deflated: torch.Tensor = self.k @ outside
        return deflated


def coupling(
    next_layer: NextLayer,
    batch_size: int,
    bases: NextBases | None = None,
) -> Coupling | None:
    """The :class:`Coupling` of the next layer's gradient and weight; ``None`` without its
    weight or where its gradient's rank is not ``batch_size`` up to :data:`COUPLING_GAP` (see
    :func:`hidden.next_layer_bases`, whose result ``bases`` passes on where it was computed
    already)."""
    weight = next_layer.weight
    if weight is None:
        return None
    bases = bases or next_layer_bases(next_layer, batch_size, COUPLING_GAP)
    if bases is None:
        return None
    k = weight.T @ bases.columns
    return Coupling(k * (batch_size**0.5 / k.norm()), next_layer.grad_weight.T @ bases.columns)


def coupled_turn(
    sign_yield: int, sign_rate: float, coupled_rate: float, noisy: bool, idle: int
) -> bool:
    """Whether a sign round (not the first) adds coupled points, from the last round's sign
    yield, the columns a second each kind found in its last turn, the noise and the rounds
    idle so far.

    Coupled points cost m B^2 an iteration each: they run after a round whose sign starts found
    no column (DP sigma=1e-6, m=4000, B=150, where each round's 8 sign starts find several:
    203 s with them every round, 43 s so, seed 0), so not in the first round (centred images,
    m=1000, B=100: 8 points there cost 1.9 of its 4.4 s, where the sign starts found every
    column in 15 rounds), and every round while they find columns faster than the sign starts
    (B=512, m=4000 at initialisation: 8 coupled points about 7 columns in 40 s, 8 sign starts 0
    to 2 in 13 s). Under noise they can also land on a mix the noise-level check passes, so
    there they wait for a round that found nothing at all (a float32 client trained 300 steps,
    B=20, m=200, seed 4, update as a float64 difference: 0 of 20 certified with them after
    every round whose sign starts found none, 20 of 20 without them).
    """
    if noisy:
        return idle > 0
    return not sign_yield or coupled_rate >= sign_rate


def coupled_search(
    geom: SignGeometry,
    k: torch.Tensor,
    count: int,
    deflation: torch.Tensor | None,
    found: torch.Tensor | None,
    generator: torch.Generator,
    out_of_time: Callable[[], bool],
    exact_deflation: bool = True,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``count`` points (search coordinates) from random starts among the unfound columns.

    Parameters
    ----------
    geom
        The sign search's view (its rows: ``k``'s).
    k
        K of :func:`coupling` on the view's rows (m x B), or its :meth:`Coupling.deflated`
        (m x (B - F)): the coordinates d of the output gradients at the next layer are
        whatever K's columns give.
    deflation
        Orthonormal basis (B x F, search coordinates) of the found samples' input coordinates,
        or ``None``: the unfound columns are orthogonal to it (P Q = I), so the points stay in
        its complement.
    found
        The found columns (F x B): the projected labels' halfspace fits leave them out, as the
        sign search's do.
    exact_deflation
        Whether ``deflation`` holds the found samples' exact coordinates. Where it holds
        estimates (max-margin fits, degrees off) the points start in its complement but move
        in every direction: confined to it, they stop degrees off the columns (a float32
        client, m=1000, B=150: median cosine 0.993 to the nearest, where unconfined points
        land on one 16 times of 16).
    dtype
        Precision of the iteration (the config's ``search_dtype``; ``None``: the geometry's).
        Its points are only proposed, and refinement takes them to float64: in float32 they
        land as often (m=1000, B=175, 3 seeds of 16 starts: 44 and 42 of 48 in float32 and
        float64) in two thirds of the time.
    """
    u, s = geom.engine_left(), geom.singular
    m, b = u.shape
    outside = torch.eye(b, dtype=u.dtype, device=u.device)
    if deflation is not None and deflation.shape[1]:
        outside = torch.linalg.svd(deflation, full_matrices=True)[0][:, deflation.shape[1] :]
    # Engine coordinates of the complement (q_engine = S q_search), orthonormal.
    complement = torch.linalg.qr(s[:, None] * outside).Q
    engine = complement if exact_deflation else torch.eye(b, dtype=u.dtype, device=u.device)
    work = dtype or u.dtype
    rows = (u @ engine).to(work)
    gram_all = rows.T @ rows
    fit_space = input_space(geom, found).to(work)
    k = k.to(work)
    chunk = max(1, _CHUNK_ELEMENTS // (m * b))
    parts: list[torch.Tensor] = []
    for begin in range(0, count, chunk):
        if parts and out_of_time():
            break
        size = min(chunk, count - begin)
        z = torch.randn(size, complement.shape[1], generator=generator, dtype=u.dtype)
        z = z.to(u.device) @ (complement.T @ engine)
        z = torch.nn.functional.normalize(z, dim=1).to(work)
        block = torch.randn(z.shape[1], _RITZ_BLOCK, generator=generator, dtype=u.dtype)
        z = _iterate(rows, gram_all, k, fit_space, z, block.to(z))
        z = z.to(u.dtype)
        parts.append(torch.nn.functional.normalize((z @ engine.T) / s, dim=1))
    return torch.cat(parts) if parts else u.new_zeros(0, b)


def _smallest_ritz(gram: torch.Tensor, start: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """Approximate unit eigenvectors of the smallest eigenvalues of K PSD matrices (K x B x B):
    block inverse iteration from each ``start`` (K x B) beside the shared directions ``block``
    (B x c), then the smallest Ritz vector of the block. A full ``eigh`` of each matrix took
    24 of the 64 s of 16 points at B=512, m=4000; with a block of 8 and 4 solves the points
    land as often (m=1000, B=175, 3 seeds of 16 starts: 44 of 48 with ``eigh``, 45 so; B=512,
    m=4000, 16 of 16). Matrices whose shifted Cholesky factor fails get ``eigh``'s vectors."""
    b = gram.shape[-1]
    eye = torch.eye(b, dtype=gram.dtype, device=gram.device)
    shift = _RITZ_SHIFT * torch.finfo(gram.dtype).eps * gram.diagonal(dim1=-2, dim2=-1).mean(-1)
    chol, info = torch.linalg.cholesky_ex(gram + shift[:, None, None] * eye)
    failed = info != 0
    chol = torch.where(failed[:, None, None], eye, chol)  # replaced below; kept finite
    v = torch.cat([start[..., None], block.expand(gram.shape[0], -1, -1)], dim=2)
    for _ in range(_RITZ_SOLVES):
        v = torch.linalg.qr(torch.cholesky_solve(v, chol)).Q
    small = v.transpose(1, 2) @ gram @ v
    w = torch.linalg.eigh((small + small.transpose(1, 2)) / 2)[1][:, :, :1]
    vectors = torch.nn.functional.normalize((v @ w)[..., 0], dim=1)
    if bool(failed.any()):
        vectors[failed] = torch.linalg.eigh(gram[failed])[1][:, :, 0]
    return vectors


def _iterate(
    rows: torch.Tensor,
    gram_all: torch.Tensor,
    k: torch.Tensor,
    fit_space: torch.Tensor,
    z: torch.Tensor,
    block: torch.Tensor,
) -> torch.Tensor:
    """The labels / eigenvector iteration (see the module's docstring) from the points ``z``,
    ``gram_all`` the Gram matrix of all ``rows``, ``block`` the shared directions of
    :func:`_smallest_ritz`.

    A point whose rows (labels and kept rows) repeat within a run of like iterations would
    repeat its step (to the block iteration's convergence), so it leaves that run. At B=512,
    m=4000 a point cost 18 s; with this and products over its active rows only
    (:func:`~attacks.spearpp.gather.masked_rows`) 8 s, the same points; in float32 with
    :func:`_smallest_ritz`, 2.4 s."""
    m = rows.shape[0]
    side = int(_SIDE * m)
    eye = torch.eye(k.shape[1], dtype=k.dtype, device=k.device)
    d = z.new_zeros(z.shape[0], k.shape[1])
    started = False
    for projected, length in ((True, PROJECTED), (False, ITERATIONS - PROJECTED)):
        live = torch.arange(z.shape[0], device=z.device)
        last: torch.Tensor | None = None
        for _ in range(length):
            c = z[live] @ rows.T
            if not started:
                inactive = c.abs() < c.abs().median(dim=1, keepdim=True).values
                started = True
            else:
                inactive = c.abs() < (c - d[live] @ k.T).abs()
            use = torch.ones_like(inactive)
            if projected:
                labels = torch.where(inactive, -1.0, 1.0).to(c.dtype)
                fit = (labels @ fit_space) @ fit_space.T
                low = fit.kthvalue(side, dim=1, keepdim=True).values
                high = fit.kthvalue(m - side + 1, dim=1, keepdim=True).values
                inactive = fit <= low
                use = inactive | (fit >= high)
            active = ~inactive & use
            key = torch.cat([active, use], dim=1)
            if last is not None:
                moved = ~(key == last).all(dim=1)
                live, active, use, key = live[moved], active[moved], use[moved], key[moved]
                if not live.numel():
                    break
            last = key
            k_active, rows_active = masked_rows(active, k, rows)
            gram_k = k_active.transpose(1, 2) @ k_active + _RIDGE * eye
            cross = k_active.transpose(1, 2) @ rows_active
            solved = solve_spd(gram_k, cross)
            gram = gram_all - cross.transpose(1, 2) @ solved
            if not bool(use.all()):
                (unused,) = masked_rows(~use, rows)
                gram = gram - unused.transpose(1, 2) @ unused
            vector = _smallest_ritz((gram + gram.transpose(1, 2)) / 2, z[live], block)
            z[live] = vector
            d[live] = (solved @ vector[..., None])[..., 0]
    return z
