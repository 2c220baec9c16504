"""Epsilon across rounds: an RDP accountant whose history the client keeps between rounds."""

from __future__ import annotations

from dataclasses import dataclass

from opacus.accountants import RDPAccountant


@dataclass(frozen=True)
class PrivacyLedger:
    """Every DP-SGD phase a client ran: (noise multiplier, sample rate, steps) per entry.

    Immutable: :meth:`spend` returns the ledger with one more phase.
    """

    phases: tuple[tuple[float, float, int], ...] = ()

    def spend(self, noise_multiplier: float, sample_rate: float, steps: int) -> PrivacyLedger:
        """The ledger after ``steps`` more steps at this noise and sample rate."""
        return PrivacyLedger((*self.phases, (noise_multiplier, sample_rate, steps)))

    def epsilon(self, delta: float) -> float:
        """(epsilon, delta)-DP spent so far, by Opacus' RDP accountant (inf without noise)."""
        if not self.phases:
            return 0.0
        if any(sigma == 0 for sigma, _, _ in self.phases):
            return float("inf")
        accountant = RDPAccountant()
        accountant.history = list(self.phases)
        return float(accountant.get_epsilon(delta))

    def as_lists(self) -> dict[str, list[float] | list[int]]:
        """Columns for a Flower ConfigRecord (kept in the client's context between rounds)."""
        return {
            "noise": [p[0] for p in self.phases],
            "rate": [p[1] for p in self.phases],
            "steps": [p[2] for p in self.phases],
        }

    @staticmethod
    def from_lists(noise: list[float], rate: list[float], steps: list[int]) -> PrivacyLedger:
        """Inverse of :meth:`as_lists`."""
        return PrivacyLedger(tuple(zip(noise, rate, steps, strict=True)))
