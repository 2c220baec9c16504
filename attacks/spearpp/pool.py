"""Step 4: the pool of distinct verified columns, and the best unverified spares."""

from __future__ import annotations

import torch

from attacks.spearpp.refine import Candidates


class ColumnPool:
    """Distinct columns of Q found so far (unit vectors, up to sign).

    Parameters
    ----------
    dim
        B, the length of each column.
    device
        Where the columns live.
    spares
        How many unverified candidates to keep for completing a short basis.
    same_cosine
        |cosine| above which two directions count as one column.
    """

    def __init__(self, dim: int, device: torch.device, spares: int, same_cosine: float) -> None:
        self._same = same_cosine
        self.columns = torch.zeros(0, dim, dtype=torch.float64, device=device)
        self.zeros = torch.zeros(0, dtype=torch.long, device=device)
        self._spares = Candidates.empty(dim, device)
        self._spare_cap = spares
        # Directions evicted as mixes: never admitted again, and points near them are dropped.
        self._banned = torch.zeros(0, dim, dtype=torch.float64, device=device)

    def __len__(self) -> int:
        return int(self.columns.shape[0])

    def add(self, cands: Candidates) -> int:
        """Add the verified candidates that are new; keep the best unverified as spares.

        Returns the number of new columns.
        """
        before = len(self)
        ok = cands.verified
        for q, z in zip(cands.directions[ok], cands.zeros[ok], strict=True):
            if not self._taken(q[None], self._same).any():
                self.columns = torch.cat([self.columns, q[None]])
                self.zeros = torch.cat([self.zeros, z[None]])
        spare = ~cands.verified & ~cands.mixed
        if spare.any():
            merged = Candidates.concat(
                [self._spares, _subset(cands, spare)], self.columns.shape[1], self.columns.device
            )
            order = merged.zeros.argsort(descending=True)[: self._spare_cap]
            self._spares = _subset(merged, order)
        return len(self) - before

    def admit(self, column: torch.Tensor, zeros: torch.Tensor) -> None:
        """Add ``column`` (B), settled by other means than the certificate, with its zeros."""
        self.columns = torch.cat([self.columns, column[None]])
        self.zeros = torch.cat([self.zeros, zeros.reshape(1)])

    def evict(self, drop: torch.Tensor, ban: torch.Tensor) -> None:
        """Remove the columns of mask ``drop``; those of mask ``ban`` are never taken again."""
        self._banned = torch.cat([self._banned, self.columns[ban]])
        self.columns, self.zeros = self.columns[~drop], self.zeros[~drop]

    def near_found(self, points: torch.Tensor, cosine: float) -> torch.Tensor:
        """Mask of ``points`` (any scale) within ``cosine`` of a found or banned column."""
        return self._taken(points.to(torch.float64), cosine)

    def _taken(self, points: torch.Tensor, cosine: float) -> torch.Tensor:
        """Mask of ``points`` within ``cosine`` of a column or a banned direction."""
        return self._near(points, self.columns, cosine) | self._near(points, self._banned, cosine)

    def spares(self) -> torch.Tensor:
        """Unverified candidates, most zeros first, distinct from the columns and each other."""
        kept = torch.zeros(
            0, self.columns.shape[1], dtype=torch.float64, device=self.columns.device
        )
        for q in self._spares.directions:
            if not self._near(q[None], torch.cat([self.columns, kept]), self._same).any():
                kept = torch.cat([kept, q[None]])
        return kept

    @staticmethod
    def _near(points: torch.Tensor, columns: torch.Tensor, cosine: float) -> torch.Tensor:
        if columns.shape[0] == 0:
            return torch.zeros(points.shape[0], dtype=torch.bool, device=points.device)
        unit = torch.nn.functional.normalize(points, dim=1)
        return torch.ge((unit @ columns.T).abs().amax(dim=1), cosine)


def _subset(cands: Candidates, index: torch.Tensor) -> Candidates:
    return Candidates(
        cands.directions[index], cands.zeros[index], cands.verified[index], cands.mixed[index]
    )
