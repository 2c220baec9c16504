"""Found samples' input coordinates from the next layer's gradient (one-step updates).

In one step the next linear layer's weight gradient is G' = sum_i w_i h_i^T, with
h_i = relu(W x_i + b) sample i's hidden vector, so its row space is the span of the B hidden
vectors. A found column's zero pattern says which neurons its sample leaves active (D_k), and
the sample's coordinates p enter h_k = D_k (A p + b) linearly: requiring h_k in that row space
is m equations in B unknowns, whose least-squares solution is p_k itself, scale included, from
the column alone. All the first layer gives is the max-margin fit to the m signs, degrees off
where m / B is small or the patterns are shared (trained networks), and the sign rounds deflate
by those estimates: at m=1000, B=100 on a network trained to 53% test accuracy, deflating by
the exact coordinates let the rounds find 100 of 100 columns where the fits let them find 91.

A pattern that is not one sample's (a wrong column) leaves a residual far above round-off, so
each estimate is used only where its residual is small, and the max-margin fit elsewhere: a
multi-step update's hidden vectors move between steps and fit no B-dimensional space.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from attacks.spearpp.gather import masked_rows
from attacks.spearpp.inputs import NextLayer
from attacks.spearpp.signs import GATHER_ELEMENTS, SignGeometry

# Gap between the B-th and (B + 1)-th singular values of G' that says its rank is B: below it
# the hidden vectors do not span a B-dimensional space (a multi-step update, noise, or a next
# layer narrower than the batch).
RANK_GAP = 1e3
# Random mixes beyond B that sketch the row space (see next_layer_bases).
_OVERSAMPLE = 8
# Relative residual of h_k off the row space under which an estimate is a sample's.
RESIDUAL = 1e-6
# Smallest singular value, relative to the largest, of the fit's system (the pattern's rows
# of the pre-activations, off the row space) under which it does not fix the input: a
# pattern with too few active neurons fits many (1e-2 on memorised networks' samples).
DETERMINED = 1e-6
# Relative distance between a sample's input from the row space and from the columns under
# which both are its own: 100 dB is an RMS error of 1e-5 of the [0, 1] pixel range, about
# 4e-5 of a normalised image's norm, so two derivations this close are each exact.
AGREE = 1e-6
# Splits of a column's magnitudes tried as its pattern (see column_patterns): the largest ratio
# may fall inside the zeros' own round-off rather than between them and the active entries.
PATTERN_TRIES = 3
# Newton steps that take each normal-equation fit to the least-squares solution (see _fits).
_REFINEMENTS = 2


def row_space_sketch(grad: torch.Tensor, rank: int, power_iterations: int) -> torch.Tensor:
    """Orthonormal columns (n x (rank + 8)) spanning the top of ``grad``'s (k x n) row space:
    the range of grad^T over random mixes of its rows (seeded, so the attack's own draws are
    untouched), refined by ``power_iterations`` (noise fills the mixes' range otherwise)."""
    width = min(rank + _OVERSAMPLE, *grad.shape)
    generator = torch.Generator(grad.device).manual_seed(0)
    mixes = torch.randn(
        grad.shape[0], width, generator=generator, dtype=grad.dtype, device=grad.device
    )
    sketch: torch.Tensor = torch.linalg.qr(grad.T @ mixes).Q
    for _ in range(power_iterations):
        sketch = torch.linalg.qr(grad.T @ (grad @ sketch)).Q
    return sketch


class NextBases(NamedTuple):
    """The next layer's weight gradient G' (k x m) at rank B: orthonormal bases of its column
    space (``columns``, k x B: the samples' output gradients there) and row space (``rows``,
    m x B: their hidden vectors), and whether its rank is B exactly (``exact``, see
    :data:`RANK_GAP`) or only up to noise, such as a float32 client's round-off; ``tilted``:
    whether the found columns may lean past the zero rule's floor, samples fading past B_hat
    in a noiseless float64 update (see :func:`column_patterns`)."""

    columns: torch.Tensor
    rows: torch.Tensor
    exact: bool
    tilted: bool = False


def next_layer_bases(
    next_layer: NextLayer, batch_size: int, min_gap: float = RANK_GAP
) -> NextBases | None:
    """:class:`NextBases` of the next layer's weight gradient, or ``None`` where the gap
    between its B-th and (B + 1)-th singular values is under ``min_gap`` (see
    :data:`RANK_GAP`).

    The range of G'^T is sketched from random mixes of its columns (k x m with k = m at
    m = 4000: one full SVD costs tens of seconds, the sketch one product): with rank B exactly,
    B + :data:`_OVERSAMPLE` mixes hold the whole row space, and the sketch's (B + 1)-th singular
    value (no larger than the gradient's own) says whether there is more. Under a gap below
    :data:`RANK_GAP` the mixes also hold noise, which one power iteration takes out.
    """
    grad = next_layer.grad_weight
    if grad.shape[0] < batch_size:
        return None
    sketch = row_space_sketch(grad, batch_size, power_iterations=0)
    for refined in (False, True):
        if refined:  # the power iteration, on the mixes already drawn
            sketch = torch.linalg.qr(grad.T @ (grad @ sketch)).Q
        left, values, right = torch.linalg.svd(grad @ sketch, full_matrices=False)
        weakest = float(values[batch_size - 1])
        after = float(values[batch_size]) if values.shape[0] > batch_size else 0.0
        exact = weakest > RANK_GAP * after and weakest > 0.0
        if exact or min_gap >= RANK_GAP:
            break
    if not (weakest > min_gap * after and weakest > 0.0):
        return None
    return NextBases(left[:, :batch_size], sketch @ right[:batch_size].T, exact)


def hidden_inputs(
    affine: torch.Tensor, active: torch.Tensor, space: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pattern's coordinates with its hidden vector in ``space``, and their residuals.

    Parameters
    ----------
    affine
        [A, b] (m x (B + 1)): the pre-activations of the coordinates and the bias.
    active
        c x m boolean patterns.
    space
        m x r orthonormal basis (``rows`` of :func:`next_layer_bases`, restricted to the rows of
        ``affine``).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        The coordinates p (c x B) minimising |(I - S S^T) D (A p + b)|, and that minimum
        relative to |D (A p + b)| (c).
    """
    fits = _fits(affine, active, space)
    return fits.coords, fits.residuals


class _Fits(NamedTuple):
    """Per pattern: the coordinates p, the residual |(I - S S^T) D (A p + b)| relative to
    |D (A p + b)|, and whether the fit is determined (its system's smallest singular value,
    relative to its largest, above :data:`DETERMINED`)."""

    coords: torch.Tensor
    residuals: torch.Tensor
    determined: torch.Tensor


def _fits(affine: torch.Tensor, active: torch.Tensor, space: torch.Tensor) -> _Fits:
    """The least-squares fits of :func:`hidden_inputs`: normal equations over each pattern's
    active rows, refined against the residual formed in full.

    With M = D [A, b] and N = S^T M the system off the row space is (I - S S^T) M, whose normal
    matrix M^T M - N^T N takes products over the active rows only; a QR and an SVD of the
    m x B system took 0.5 s a pattern at B=512, m=4000, where the certificate fits about 2,000
    patterns. The normal equations square the system's condition, so each solution is refined
    (:data:`_REFINEMENTS` Newton steps) against its residual (I - S S^T) D (A p + b) formed
    directly, which is also the residual that decides."""
    m, width = affine.shape
    chunk = max(1, GATHER_ELEMENTS // (m * width))
    eye = torch.eye(width - 1, dtype=affine.dtype, device=affine.device)
    parts: list[_Fits] = []
    for part in active.split(chunk):
        rows, basis = masked_rows(part, affine, space)
        n = basis.transpose(1, 2) @ rows
        normal = rows.transpose(1, 2) @ rows - n.transpose(1, 2) @ n
        system = normal[:, :-1, :-1]
        values = torch.linalg.eigvalsh(system)
        factor, info = torch.linalg.cholesky_ex(system)
        solvable = info == 0
        determined = solvable & (values[:, 0] > DETERMINED**2 * values[:, -1])
        # Systems that are not numerically positive definite fit nothing (they are not
        # determined); the identity keeps their solves finite.
        factor = torch.where(solvable[:, None, None], factor, eye)
        p = torch.cholesky_solve(-normal[:, :-1, -1:], factor)[..., 0]
        for _ in range(_REFINEMENTS):
            off, _ = _off_space(affine, part, space, p)
            gradient = (off * part) @ affine[:, :-1]
            p = p - torch.cholesky_solve(gradient[..., None], factor)[..., 0]
        off, hidden = _off_space(affine, part, space, p)
        size = hidden.norm(dim=1).clamp_min(torch.finfo(p.dtype).tiny)
        parts.append(_Fits(p, off.norm(dim=1) / size, determined))
    if not parts:
        empty = affine.new_zeros(0)
        return _Fits(affine.new_zeros(0, width - 1), empty, empty.bool())
    return _Fits(*(torch.cat(column) for column in zip(*parts, strict=True)))


def _off_space(
    affine: torch.Tensor, active: torch.Tensor, space: torch.Tensor, coords: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(I - S S^T) h and h = D (A p + b) (each c x m) for patterns D and coordinates p."""
    hidden = pre_activations(affine, coords) * active
    return hidden - (hidden @ space) @ space.T, hidden


class InputSpan(NamedTuple):
    """Where the row-space fit looks for inputs: orthonormal rows spanning them (``basis``,
    r x n) and their pre-activations with the bias (``affine``, m x (r + 1): [W basis^T, b])."""

    basis: torch.Tensor
    affine: torch.Tensor

    @staticmethod
    def of(geom: SignGeometry, right: torch.Tensor) -> InputSpan:
        """The batch's span as the factorisation gives it (``right`` = S V^T, B x n)."""
        return InputSpan(right / geom.singular[:, None], geom.affine())

    def extended(self, rows: torch.Tensor, weight: torch.Tensor) -> InputSpan:
        """This span and the orthonormal ``rows`` (e x n) off it; ``weight``: the layer's."""
        pre = weight.to(rows) @ rows.T
        affine = torch.cat([self.affine[:, :-1], pre, self.affine[:, -1:]], dim=1)
        return InputSpan(torch.cat([self.basis, rows]), affine)


def confirmed_inputs(
    inputs: torch.Tensor, span: InputSpan, space: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each input as the row space gives it, whether that is a sample's, and whether it
    confirms ``inputs`` (float64, noiseless one-step updates).

    The inputs from the columns (x = Q^-1 R, scaled by the bias gradient) depend on every
    column: with one missing, or one pinned loosely by its zeros, none is vouched for, though
    most are exact. Each input's activity pattern D gives the input whose hidden vector
    D (W x + b) is nearest the row space, x in the span of the batch. A sample's lies in it to
    round-off (:data:`RESIDUAL`), uniquely where the fit is determined (:data:`DETERMINED`),
    and leaves the same neurons active; an input that is not a sample's does not: on the
    neurons where a blend's samples disagree its pre-activation is no combination of their
    hidden vectors. Where that input also agrees with the columns' (:data:`AGREE`), two
    derivations vouch for it.

    Parameters
    ----------
    inputs
        The inputs from the columns (B x n).
    span
        Where to look for the inputs (:meth:`InputSpan.of` the sign search's geometry with the
        bias, and the faint samples' directions where there are any, see
        :mod:`attacks.spearpp.faint`).
    space
        The next layer's row space (m x B, ``rows`` of :func:`next_layer_bases`).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor, torch.Tensor]
        The inputs from the row space (B x n), which of them are samples' (B), and which of
        those confirm ``inputs`` (B).
    """
    basis, affine = span
    from_space, held = held_inputs(pre_activations(affine, inputs @ basis.T) > 0, span, space)
    close = (from_space - inputs).norm(dim=1) <= AGREE * inputs.norm(dim=1)
    return from_space, held, held & close


def held_inputs(
    active: torch.Tensor, span: InputSpan, space: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each pattern (c x m boolean), the input from the row space (c x n) and whether it
    is a sample's: its hidden vector in ``space`` to :data:`RESIDUAL`, the fit determined
    (:data:`DETERMINED`), and its own activity the pattern itself (see
    :func:`confirmed_inputs`)."""
    basis, affine = span
    found, residuals, determined = _fits(affine, active, space)
    own = (pre_activations(affine, found) > 0) == active
    held = (residuals < RESIDUAL) & own.all(dim=1) & determined
    return found @ basis, held


def column_inputs(
    columns: torch.Tensor, span: InputSpan, space: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The input each column's zeros give from the row space (c x n; ``columns``: c x m, the
    output gradients L q) and whether one of its :func:`column_patterns` held
    (:func:`held_inputs`)."""
    found = columns.new_zeros(columns.shape[0], span.basis.shape[1])
    held = torch.zeros(columns.shape[0], dtype=torch.bool, device=columns.device)
    for active in column_patterns(columns, PATTERN_TRIES):
        left = torch.nonzero(~held)[:, 0]
        if not left.numel():
            break
        inputs, ok = held_inputs(active[left], span, space)
        found[left[ok]] = inputs[ok]
        held[left[ok]] = True
    return found, held


def repeated(inputs: torch.Tensor, kept: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """Which ``fresh`` rows of ``inputs`` (c x n) repeat, to :data:`AGREE`, a ``kept`` row or
    an earlier ``fresh`` one (boolean masks of c, returned on ``fresh``'s device)."""
    old, new = kept.to(inputs.device), fresh.to(inputs.device)
    close = torch.cdist(inputs, inputs) <= AGREE * inputs.norm(dim=1)[:, None]
    earlier = torch.ones_like(close).tril(diagonal=-1)
    prior = old[None, :] | (new[None, :] & earlier)
    again: torch.Tensor = new & (close & prior).fill_diagonal_(False).any(dim=1)
    return again.to(fresh.device)


def column_patterns(columns: torch.Tensor, tries: int) -> torch.Tensor:
    """Candidate active neurons of each column (``columns``: c x m, the output gradients L q),
    ``tries`` x c x m: its entries above the largest ratios between two of its magnitudes in
    turn, the largest first (exact zeros, such as silent neurons', count as its smallest
    nonzero entry).

    A column solved at B_hat carries the tilt of the samples fading past it on its sample's
    inactive neurons, above the zero rule's round-off floor (m=1000 trained 40 epochs, its
    own images, B=150: up to 3e-5 of its largest entry, its active entries 2e-3 and more),
    so its zeros are read off that gap instead. A split in the wrong place costs nothing:
    the row-space fit holds only an input whose activity is the pattern itself.
    """
    size = columns.abs()
    smallest = torch.where(size > 0, size, torch.inf).amin(dim=1, keepdim=True)
    ordered = torch.where(size > 0, size, smallest).sort(dim=1, descending=True).values
    logs = ordered.log()
    splits = (logs[:, :-1] - logs[:, 1:]).topk(tries, dim=1).indices  # c x tries
    return size[None] >= ordered.gather(1, splits).T[:, :, None]


def pre_activations(affine: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """A p + b (c x m) of coordinates p (c x B)."""
    return coords @ affine[:, :-1].T + affine[:, -1]
