"""``FoundInputs``: the pool's samples' input coordinates, by which the sign rounds deflate."""

from __future__ import annotations

import torch

from attacks.spearpp.harvest import Harvester
from attacks.spearpp.hidden import (
    PATTERN_TRIES,
    RESIDUAL,
    NextBases,
    column_patterns,
    hidden_inputs,
    pre_activations,
)
from attacks.spearpp.signs import SignGeometry, deflation_basis, fit_inputs
from attacks.spearpp.zero_rule import zero_mask

# The next layer's row space is trusted once it holds this many found patterns per one it
# does not: a multi-step update's (whose rank test can pass by chance) holds none, and the
# first five columns of [0, 1] pixels at B=50, m=1000 held four and a mix.
_TRUST = 2


class FoundInputs:
    """Input coordinates of the pool's columns, in pool order, and the deflation basis.

    Max-margin fits to each column's activity pattern, or, with the next layer's row space
    (``hidden``, see :mod:`attacks.spearpp.hidden`; given only where the geometry's fits are
    affine, since it holds D (A p + b)), the exact coordinates of every pattern it holds. Where
    the row space's rank is B exactly (``NextBases.exact``) and it holds most, a verified
    column whose pattern it does not hold is no sample's: a mix the pool verified (B=150,
    m=1000, a converged network: one, 30 neurons off the nearest sample's pattern, held the
    rounds at 140 of 150), and is evicted. Then every estimate is exact, and so is the
    complement the rounds search. Where samples fade into the round-off instead (memorised
    networks: B_hat short of B, no gap at it), the row space still holds the hidden vectors
    of all but the faintest found samples, but not holding a pattern proves nothing: nothing
    is evicted.
    """

    def __init__(
        self, harvest: Harvester, geom: SignGeometry, hidden: NextBases | None, b: int
    ) -> None:
        self._harvest, self._geom, self._hidden, self._b = harvest, geom, hidden, b
        pool = harvest.pool
        self.inputs = torch.zeros(0, b, dtype=torch.float64, device=pool.columns.device)
        # Which estimates are exact, and how many patterns the row space did not hold were
        # evicted.
        self._held = torch.zeros(0, dtype=torch.bool, device=pool.columns.device)
        self._evicted = 0
        self.basis: torch.Tensor | None = None

    @property
    def exact(self) -> bool:
        """Whether every estimate is exact (from the row space) and there is one at least."""
        return bool(self._held.numel()) and bool(self._held.all())

    def hidden(self) -> torch.Tensor:
        """The hidden vectors ReLU(A p + b) of the pool's samples (F x m, on the geometry's
        rows), exact where every estimate is (:attr:`exact`)."""
        return torch.relu(pre_activations(self._geom.affine(), self.inputs))

    def update(self) -> None:
        """Estimate the columns the pool gained since the last call (the deflation changes
        only then)."""
        pool = self._harvest.pool
        fresh = pool.columns[self.inputs.shape[0] :]
        if not fresh.shape[0]:
            return
        geom = self._geom
        active = ~zero_mask(geom.engine_left(), fresh, self._harvest.rule)
        held = torch.zeros(fresh.shape[0], dtype=torch.bool, device=fresh.device)
        if self._hidden is None:
            estimates = fit_inputs(geom.affine(), active)[:, : self._b]
        else:
            estimates, residual = hidden_inputs(geom.affine(), active, self._hidden.rows)
            held = residual < RESIDUAL
            # A column tilted by faint samples past the zero rule's floor has its pattern at
            # a gap of its magnitudes instead (see hidden.column_patterns); each split tried
            # costs a fit per column not yet held, so only where faint samples tilt them: at
            # float32's round-off or under noise few patterns hold to RESIDUAL at all.
            unheld = torch.nonzero(~held & self._hidden.tilted)[:, 0]
            splits = column_patterns(fresh[unheld] @ geom.engine_left().T, PATTERN_TRIES)
            for split in splits if unheld.numel() else ():
                todo = ~held[unheld]
                if not bool(todo.any()):
                    break
                more, residual = hidden_inputs(geom.affine(), split[todo], self._hidden.rows)
                ok = residual < RESIDUAL
                estimates[unheld[todo][ok]], held[unheld[todo][ok]] = more[ok], True
            if not bool(held.all()):
                estimates[~held] = fit_inputs(geom.affine(), active[~held])[:, : self._b]
        self.inputs = torch.cat([self.inputs, estimates])
        self._held = torch.cat([self._held, held])
        off = ~self._held
        evicts = self._hidden is not None and self._hidden.exact
        if evicts and bool(off.any()) and self._trusted(int(off.sum())):
            # Not banned: a ban drops points near the mix, and one mixing in a small share of
            # another column lies near its main column (m=200 trained 60 epochs, B=20: banned,
            # 1 and 2 of 20 samples exact; evicted alone, 20 and 17, as without evicting).
            pool.evict(off, torch.zeros_like(off))
            self._harvest.reopen()
            self._evicted += int(off.sum())
            self.inputs, self._held = self.inputs[~off], self._held[~off]
        self.basis = (
            deflation_basis(geom.to_search(pool.columns), self.inputs) if len(pool) else None
        )

    def _trusted(self, off: int) -> bool:
        """Whether the row space holds enough found patterns to evict ``off`` it does not."""
        return int(self._held.sum()) >= _TRUST * (off + self._evicted)
