"""Step 1: the low-rank factorisation dL/dW = L R and the batch size read off its rank.

Noise, declared or not, shows in the spectrum: an m x n matrix of i.i.d. entries of std s has its
singular values in a Marchenko-Pastur bulk with top edge s (sqrt(m) + sqrt(n)), and a rank-B
gradient plus that noise keeps B singular values above it. Undeclared noise above the round-off is
fitted as a bulk: for rank r the energy outside the top r directions is s^2 (m - r) (n - r), r the
count above the edge this s puts (a fixed point from r = 0 up), counted as noise only when the
largest value left out sits at the fitted edge, as Gaussian noise puts it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from attacks.errors import AttackInputError, NotLowRankError
from attacks.spearpp.inputs import FLOAT32_PRECISION
from attacks.spearpp.weak_rank import weak_rank

# A Gaussian m x n noise matrix of entry std s has its largest singular value near
# s (sqrt(m) + sqrt(n)); signal must clear that edge by this factor to count.
NOISE_EDGE_FACTOR = 1.5
_OVERSAMPLE = 16
# Undeclared noise: the signal must stand this far above the noise bulk at the gap.
MIN_SPECTRAL_GAP = 100.0
# The largest singular value left out of a fitted bulk must lie within these factors of the
# fitted edge for the tail to count as noise. Measured: 0.98 to 1.0 under DP-SGD noise and under
# float32 round-off of weight differences (0.95 from the randomised SVD at m = 4000); 1.5 where
# the fit creeps into a full-rank gradient's own decaying spectrum (real images, B >= m), 1.6 for
# a float32 gradient's own round-off (which grows with each entry), 1.24 for a product of two
# Gaussian matrices (B = 2m): none of these is a bulk.
BULK_TOP_RANGE = (0.8, 1.15)
# With the whole spectrum computed, the tail's median singular value must also lie within these
# factors of the Marchenko-Pastur median for the fitted std (measured 0.99 to 1.0 under noise,
# 0.77 to 0.88 for full-rank gradients).
BULK_MEDIAN_RANGE = (0.9, 1.1)
# Dropped singular values between the top of that range and the threshold are weak spikes
# (samples, or structure, too faint to count); a bulk has at most this many. A fit that crept into
# a gradient's own spectrum leaves a continuum of them.
MAX_WEAK_SPIKES = 4
# A fitted bulk this many times above the declared noise level is noise that was not declared.
UNDECLARED_FACTOR = 1.5
# A float32 gradient's singular values below its precision floor count as samples where they
# clear this many times the edge of the round-off's bulk beyond the floor's rank. The bulk of
# a float32 gradient's own round-off is no Marchenko-Pastur one (its top reaches 1.6 times the
# fitted edge); weak samples of trained networks stood 6 to 30,000 times above it.
ROUNDOFF_EDGE_FACTOR = 4.0


def bulk_edge(std: float, rows: int, cols: int) -> float:
    """Top edge of the singular values of a ``rows`` x ``cols`` matrix of i.i.d. entries of
    ``std``: std (sqrt(rows) + sqrt(cols))."""
    return std * (math.sqrt(rows) + math.sqrt(cols))


def mp_median(rows: int, cols: int) -> float:
    """Median singular value of a ``rows`` x ``cols`` matrix of i.i.d. unit-variance entries
    (the Marchenko-Pastur law, by quadrature)."""
    p, q = sorted((rows, cols))
    c = p / q
    low, high = (1 - math.sqrt(c)) ** 2, (1 + math.sqrt(c)) ** 2
    edges = torch.linspace(low, high, 4097, dtype=torch.float64)
    x = (edges[1:] + edges[:-1]) / 2
    density = ((high - x) * (x - low)).clamp_min(0).sqrt() / (2 * math.pi * c * x)
    cdf = (density * (edges[1:] - edges[:-1])).cumsum(0)
    median = float(x[int(torch.searchsorted(cdf, 0.5 * float(cdf[-1])))])
    return math.sqrt(q * median)


@dataclass(frozen=True)
class NoiseBulk:
    """A Marchenko-Pastur fit of the spectrum's tail.

    Attributes
    ----------
    rank
        Singular values above ``NOISE_EDGE_FACTOR`` times the fitted edge.
    std
        Fitted per-entry noise std.
    edge
        The bulk's top edge, ``std * (sqrt(m - rank) + sqrt(n - rank))``.
    top
        The largest singular value left out over the edge, weak spikes aside (NaN when none
        was computed).
    weak
        Weak spikes: singular values left out above ``BULK_TOP_RANGE[1]`` times the edge.
    median
        The median singular value left out over the Marchenko-Pastur median for ``std`` (NaN
        unless the whole spectrum was computed).
    """

    rank: int
    std: float
    edge: float
    top: float
    weak: int = 0
    median: float = math.nan

    @property
    def consistent(self) -> bool:
        """Whether the tail's top (and, when known, its median) sits where Gaussian noise of the
        fitted std puts it."""
        low, high = BULK_TOP_RANGE
        mid_low, mid_high = BULK_MEDIAN_RANGE
        median_fits = math.isnan(self.median) or mid_low <= self.median <= mid_high
        return low <= self.top <= high and median_fits and self.weak <= MAX_WEAK_SPIKES


def fit_bulk(
    s: torch.Tensor, outside: float, shape: tuple[int, int], rank: int | None = None
) -> NoiseBulk:
    """Fit the noise bulk of a spectrum.

    Parameters
    ----------
    s
        The leading singular values (descending), as many as were computed.
    outside
        Energy (squared Frobenius norm) of the matrix outside the span those came from (0 for a
        full SVD).
    shape
        (m, n).
    rank
        Fit the bulk beyond this rank; ``None``: the fixed point (the number of singular values
        above ``NOISE_EDGE_FACTOR`` times the edge the fit beyond them puts).
    """
    m, n = shape
    k = int(s.shape[0])
    energy = s.double().square().cpu()
    # tails[r]: the energy outside the top r singular directions.
    tails = torch.cat([energy.flip(0).cumsum(0).flip(0), energy.new_zeros(1)]) + outside

    def fit(r: int) -> tuple[float, float]:
        std = math.sqrt(max(float(tails[r]), 0.0) / ((m - r) * (n - r)))
        return std, bulk_edge(std, m - r, n - r)

    full = min(m, n)
    if rank is None:
        r = 0
        while True:
            std, edge = fit(r)
            above = int((s > NOISE_EDGE_FACTOR * edge).sum())
            if above <= r or above >= full:
                r = max(r, min(above, full - 1))
                break
            r = above
    else:
        r = min(rank, full - 1)
    std, edge = fit(r)
    weak = int((s[r:] > BULK_TOP_RANGE[1] * edge).sum()) if edge > 0 else 0
    top = float(s[r + weak]) / edge if r + weak < k and edge > 0 else math.nan
    median = math.nan
    if k >= full and r < k and std > 0:
        median = float(s[r:].median()) / (std * mp_median(m - r, n - r))
    return NoiseBulk(r, std, edge, top, weak, median)


def rank_confidence(s: torch.Tensor, rank: int, threshold: float, scale: float) -> float:
    """In [0, 1]: how clearly ``threshold`` separates the weakest singular value kept (s_B) from
    the strongest dropped (s_{B+1}): the smaller of log(s_B / threshold) and
    log(threshold / s_{B+1}), over log(scale); 1 when both lie at least a factor ``scale`` from
    it, 0 when one sits at it or on its wrong side."""
    margins = []
    if rank >= 1:
        margins.append(math.log(float(s[rank - 1]) / threshold))
    if rank < s.shape[0] and float(s[rank]) > 0:
        margins.append(math.log(threshold / float(s[rank])))
    if not margins:
        return 1.0
    return min(1.0, max(0.0, min(margins) / math.log(scale)))


@dataclass(frozen=True)
class Factorisation:
    """dL/dW ~= left @ right, with ``left`` (m x B) orthonormal and ``right`` = S V^T (B x n).

    Attributes
    ----------
    left, right
        The factors, float64.
    singular_values
        The leading singular values that were computed (at least B of them).
    batch_size
        B_hat, the rank used (0 when nothing stands above the noise).
    method
        How B_hat was found: ``declared``, ``float-rank`` (above the round-off), ``noise-edge``
        (above the declared noise's edge), ``noise-bulk`` (above the edge of the noise bulk
        fitted to the spectrum) or ``spectral-gap``.
    noise_std
        The per-entry noise std the attack works with: the declared one, or the fitted bulk's
        when none was declared or the bulk stands clearly above the declared level; 0 for none.
    noise_declared
        The declared noise std (``None``: not told).
    noise_estimated
        The fitted bulk's std beyond B_hat, when the tail is a noise bulk above the round-off
        (``None`` otherwise).
    undeclared_noise
        The spectrum shows noise that was not declared: a bulk without a declared level, or one
        ``UNDECLARED_FACTOR`` times above it.
    confidence
        Of B_hat, in [0, 1] (:func:`rank_confidence` at the threshold ``method`` used; 1 when
        the batch size was declared).
    spectrum
        The ratios behind it: ``weakest_over_threshold`` (s_B over the threshold),
        ``strongest_dropped_over_threshold`` (s_{B+1} over it), ``gap`` (s_B / s_{B+1}) and,
        with a bulk, ``weakest_over_edge`` and ``bulk_top_over_edge``.
    note
        What the spectrum says of the noise, in words.
    roundoff_std
        For a float32 gradient without noise, the per-entry std of its round-off: the bulk
        fitted to the spectrum beyond B_hat; 0 otherwise. A float32 gradient carries round-off
        of about 1e-7 of its largest entries in every entry. Relative to one column of Q that
        is 1e-7 over the column's share of the gradient, and on a trained network
        well-classified samples hold 1e-2 to 1e-5 of it, so their zeros sit far above any
        floor relative to their own entries (B=20, m=200 after 300 SGD steps: every column
        verified wrong, 0 of 20 samples certified and none near-exact, where the same
        gradient in float64 is exact). The engine takes it as noise of this level, so each
        direction's tolerance grows with 1 / S along it as the round-off does; the factors
        get the power iterations noise gets. Together: 100% near-exact and certified on those
        seeds (either alone: at most 50% near-exact, none certified).
    """

    left: torch.Tensor
    right: torch.Tensor
    singular_values: torch.Tensor
    batch_size: int
    method: str
    noise_std: float = 0.0
    noise_declared: float | None = None
    noise_estimated: float | None = None
    undeclared_noise: bool = False
    confidence: float = 1.0
    spectrum: dict[str, float] = field(default_factory=dict)
    note: str = ""
    roundoff_std: float = 0.0

    @property
    def noise_edge(self) -> float:
        """Top edge of the bulk of ``noise_std`` beyond B_hat (0 without noise)."""
        m, n = self.left.shape[0], self.right.shape[1]
        return bulk_edge(self.noise_std, m - self.batch_size, n - self.batch_size)

    def report(self) -> dict[str, Any]:
        """The fields of :class:`attacks.result.Reconstruction` this factorisation fills."""
        return {
            "noise_declared": self.noise_declared,
            "noise_std_estimated": self.noise_estimated,
            "noise_std_used": self.noise_std,
            "undeclared_noise": self.undeclared_noise,
            "batch_size_confidence": self.confidence,
            "spectrum": dict(self.spectrum),
            "noise_note": self.note,
        }


def _top_svd(
    matrix: torch.Tensor, k: int, generator: torch.Generator, power_iters: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Leading k singular triplets, a randomised range finder unless k is the full rank, and the
    energy of ``matrix`` outside the range they span (0 for the full SVD)."""
    m, n = matrix.shape
    if k >= min(m, n):
        u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
        return u, s, vh, 0.0
    probe = torch.randn(n, k, generator=generator, dtype=matrix.dtype).to(matrix.device)
    basis, _ = torch.linalg.qr(matrix @ probe)
    for _ in range(power_iters):
        basis, _ = torch.linalg.qr(matrix.T @ basis)
        basis, _ = torch.linalg.qr(matrix @ basis)
    small = basis.T @ matrix
    u_small, s, vh = torch.linalg.svd(small, full_matrices=False)
    outside = float((matrix - basis @ small).square().sum())
    return basis @ u_small, s, vh, outside


def _gap_rank(s: torch.Tensor) -> int:
    """Position of the largest ratio between consecutive singular values."""
    logs = torch.log(s.clamp_min(float(s[0]) * 1e-300))
    return int(torch.argmax(logs[:-1] - logs[1:])) + 1


def _ratios(s: torch.Tensor, rank: int, threshold: float) -> dict[str, float]:
    out: dict[str, float] = {}
    if rank >= 1:
        out["weakest_over_threshold"] = float(s[rank - 1]) / threshold
    if rank < s.shape[0]:
        out["strongest_dropped_over_threshold"] = float(s[rank]) / threshold
        if rank >= 1 and float(s[rank]) > 0:
            out["gap"] = float(s[rank - 1] / s[rank])
    return out


def factorise(
    grad_weight: torch.Tensor,
    *,
    batch_size: int | None,
    noise_std: float | None,
    precision: float,
    generator: torch.Generator,
) -> Factorisation:
    """Factor the weight gradient and settle the batch size and the noise level.

    Parameters
    ----------
    grad_weight
        m x n float64 gradient of the layer's weight.
    batch_size
        Declared B, used as the rank when given.
    noise_std
        Declared per-entry noise std (DP-SGD); the rank is then the number of singular values
        above the noise edge. When not declared (or declared well below what the spectrum
        shows), the noise bulk is fitted to the spectrum, and its std and edge are used.
    precision
        Relative round-off of the gradient: singular values below it are not samples.
    generator
        Source of the random probes (on the CPU).

    Raises
    ------
    AttackInputError
        When the declared or estimated batch size is not below m and n: the gradient is then not
        low-rank and the batch is not identifiable from it.
    """
    m, n = grad_weight.shape
    full = min(m, n)
    if batch_size is not None and not 1 <= batch_size < full:
        raise AttackInputError(
            f"batch_size={batch_size}: a batch is identifiable only for 1 <= B < min(m, n) = {full}"
        )
    if noise_std is not None and not (noise_std >= 0 and math.isfinite(noise_std)):
        raise AttackInputError(f"noise_std={noise_std!r}: must be a finite number >= 0")
    declared = float(noise_std or 0.0)
    noisy = bool(declared)
    float32 = precision >= FLOAT32_PRECISION
    k = min(full, (batch_size or 112) + _OVERSAMPLE)
    bulk: NoiseBulk | None
    # A float32 gradient's round-off, fitted as a bulk beyond the rank (see roundoff_std).
    roundoff: NoiseBulk | None = None
    while True:
        # Each pass fits its own bulk: one fitted to fewer probes may hold samples (B=150 past
        # k=120, a trained network's falling spectrum, read as undeclared noise once kept).
        bulk = None
        state = generator.get_state()
        u, s, vh, outside = _top_svd(grad_weight, k, generator, power_iters=2 if noisy else 0)
        at_full = k >= full
        floor = precision * float(s[0])
        if batch_size is not None:
            rank, method, threshold = batch_size, "declared", 0.0
            # Noise beyond the declared rank, or a float32 gradient's round-off: fit it from
            # refined probes, as without a declared B (B=20, m=200 after 300 SGD steps, float32,
            # B declared: 0 of 20 samples near-exact when its round-off was left out).
            if not noisy and (float(s[rank]) > floor or (float32 and not declared)):
                noisy = True
                generator.set_state(state)
                continue
            fit = fit_bulk(s, outside, (m, n), rank)
            bulk = fit if fit.consistent and fit.edge > floor else None
            if float32 and bulk is None and not declared:
                roundoff = fit
            break
        if not declared and float(s[-1]) <= floor:
            if float32 and not noisy:
                # float32 round-off is noise to the columns of weak samples (see
                # Factorisation.roundoff_std): the factors need the power iterations noise gets.
                noisy = True
                generator.set_state(state)
                continue
            rank, method, threshold = int((s > floor).sum()), "float-rank", floor
            if not float32:
                rank, threshold = weak_rank(s, rank, threshold)
            if float32 and rank < k:
                # Weak samples of a trained network sit below the floor but far above the
                # round-off's own bulk (B=50, m=1000, 1000 SGD steps: two at 5.6e-6 and 1.7e-6
                # of s_1, the bulk's top at 2.8e-7): they count where they clear its edge.
                roundoff = fit_bulk(s, outside, (m, n), rank)
                above = int((s > ROUNDOFF_EDGE_FACTOR * roundoff.edge).sum())
                if rank < above < k - _OVERSAMPLE:
                    rank, threshold = above, ROUNDOFF_EDGE_FACTOR * roundoff.edge
                    roundoff = fit_bulk(s, outside, (m, n), rank)
            break
        fit = fit_bulk(s, outside, (m, n))
        if not noisy and not at_full and fit.rank < k - _OVERSAMPLE:
            # A tail above the round-off and below a bulk's edge: fit it as noise, from the same
            # probes refined by power iterations, as under declared noise.
            noisy = True
            generator.set_state(state)
            continue
        bulk = fit if fit.consistent and fit.edge > floor else None
        if declared and not (bulk is not None and bulk.std > UNDECLARED_FACTOR * declared):
            threshold = NOISE_EDGE_FACTOR * bulk_edge(declared, m, n)
            rank, method = int((s > threshold).sum()), "noise-edge"
            if rank < k - _OVERSAMPLE or at_full:
                break
        elif bulk is not None:
            rank, method, threshold = bulk.rank, "noise-bulk", NOISE_EDGE_FACTOR * bulk.edge
            if rank < k - _OVERSAMPLE or at_full:
                break
        elif at_full:
            # Without a clear gap the spectrum is the gradient's own: full rank, B >= min(m, n).
            gap_rank = _gap_rank(s)
            clear = float(s[gap_rank - 1]) >= MIN_SPECTRAL_GAP * float(s[gap_rank])
            rank, method = (gap_rank if clear else full), "spectral-gap"
            threshold = math.sqrt(float(s[gap_rank - 1] * s[gap_rank]))
            break
        k = min(full, 2 * k)
    if rank >= full:
        raise NotLowRankError(rank, method, m, n)
    if bulk is not None and bulk.rank != rank:
        bulk = fit_bulk(s, outside, (m, n), rank)
    estimated = bulk.std if bulk is not None else None
    undeclared = estimated is not None and estimated > UNDECLARED_FACTOR * declared
    used = estimated if (undeclared and estimated is not None) else declared
    tail_above = rank < s.shape[0] and float(s[rank]) > floor
    if method == "declared":
        confidence = 1.0
        spectrum = {"gap": float(s[rank - 1] / s[rank])} if rank < s.shape[0] else {}
    else:
        # Noise: 1 once s_B stands a factor sqrt(1.5) above the threshold (1.8 times the edge)
        # and s_{B+1} as far below it (1.2 times the edge, where the bulk's top fluctuates).
        scale = math.sqrt(MIN_SPECTRAL_GAP if method == "spectral-gap" else NOISE_EDGE_FACTOR)
        confidence = rank_confidence(s, rank, threshold, scale)
        spectrum = _ratios(s, rank, threshold)
    if bulk is not None:
        if rank >= 1:
            spectrum["weakest_over_edge"] = float(s[rank - 1]) / bulk.edge
        spectrum["bulk_top_over_edge"] = bulk.top
        spectrum["weak_spikes"] = float(bulk.weak)
    return Factorisation(
        left=u[:, :rank].contiguous(),
        right=s[:rank, None] * vh[:rank],
        singular_values=s,
        batch_size=rank,
        method=method,
        noise_std=used,
        noise_declared=noise_std,
        noise_estimated=estimated,
        undeclared_noise=undeclared,
        confidence=confidence,
        spectrum=spectrum,
        note=_note(noise_std, estimated, undeclared, float(s[0]), tail_above)
        + (
            f"; float32 round-off taken as noise of std {roundoff.std:.3g} per entry (fitted to "
            "the spectrum's tail)"
            if roundoff is not None
            else ""
        ),
        roundoff_std=roundoff.std if roundoff is not None else 0.0,
    )


def _note(
    declared: float | None, estimated: float | None, undeclared: bool, top: float, above: bool
) -> str:
    if estimated is None:
        told = "none declared" if not declared else f"declared {declared:.3g} per entry"
        if above:
            return f"the spectrum's tail stands above the round-off, no Gaussian bulk ({told})"
        return f"no noise bulk above the round-off in the spectrum ({told})"
    bulk = f"a noise bulk of std {estimated:.3g} per entry ({estimated / top:.1e} of s_1)"
    if not declared:
        return f"undeclared noise: none declared, the spectrum shows {bulk}; used as the level"
    if undeclared:
        return (
            f"undeclared noise: the spectrum shows {bulk}, {estimated / declared:.1f} times the "
            f"declared {declared:.3g}; the estimate was used"
        )
    return f"declared {declared:.3g} per entry; the spectrum shows {bulk}"
