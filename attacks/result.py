"""What an attack returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

Status = Literal["exact", "partial", "failed", "approximate"]


@dataclass(frozen=True)
class Reconstruction:
    """One reconstructed batch and how it was obtained.

    Attributes
    ----------
    inputs
        B_hat x n reconstruction in the layer's input space (float64, CPU).
    batch_size
        B_hat.
    batch_size_method
        How B_hat was found: ``declared``, ``float-rank``, ``noise-edge`` (above the declared
        noise), ``noise-bulk`` (above the noise bulk fitted to the spectrum) or ``spectral-gap``.
    status
        ``exact`` when every one of the B_hat columns was verified and every sample's sparsity
        matching coefficient is at least 0.95, ``partial`` when some columns were verified (the
        rest completed), ``failed`` when none was; ``approximate`` for an optimisation-based
        attack, which has no certificate.
    confidence
        Per reconstructed sample, in [0, 1]: for SPEAR++ the sparsity matching coefficient (1: the
        sample's inactive neurons are exactly the zeros of its gradient); for the optimisation
        attack the cosine similarity of the reconstruction's gradient with the observed one.
    verified
        Per reconstructed sample, whether its column was certified (one sample's output
        gradient exactly). A verified column alone does not fix its sample's input while other
        columns are missing: the input depends on every column.
    certified
        Per reconstructed sample, whether the attack vouches for the input itself, without
        ground truth: every sample of an ``exact`` batch, and in a partial one each sample a
        neuron isolates (:mod:`attacks.spearpp.isolate`). Never set by an optimisation attack.
    timings
        Seconds per stage (``factorise``, ``search``, ``refine``, ``select``, ``solve``, ``total``).
    counts
        ``starts``, ``passes``, ``candidates`` (directions proposed), ``unique`` (distinct
        verified columns), ``selected``; SPEAR++ adds ``sign_rounds``, ``settled_last``
        (columns settled in closed form once only one or two were missing),
        ``unpinned_last`` (1 where the last column's zeros did not pin it) and
        ``next_layer_settled`` (samples the next layer's gradient then fixed) and
        ``next_layer_certified`` (samples certified because their inputs from the next
        layer's row space agree with their columns').
    settings
        The configuration used, plus the device and what the attacker was told.
    reason
        Why the result is not exact, when the engine can say ('' otherwise).
    noise_declared
        The per-entry noise std the attacker was told (``None``: not told).
    noise_std_estimated
        The std of the noise bulk fitted to the gradient's spectrum beyond B_hat (``None`` when
        the tail is no noise bulk above the round-off).
    noise_std_used
        The level the zero tolerances followed: the declared one, or the estimate when none was
        declared or the spectrum shows clearly more (0: none).
    undeclared_noise
        The spectrum shows noise that was not declared (none declared, or clearly above the
        declared level).
    batch_size_confidence
        Of B_hat, in [0, 1]: how clearly the threshold that gave it separates the weakest kept
        singular value from the strongest dropped one (1 when declared; see
        :func:`attacks.spearpp.factor.rank_confidence`).
    spectrum
        The singular-value ratios behind that confidence (``weakest_over_threshold``,
        ``strongest_dropped_over_threshold``, ``gap``, and with a noise bulk
        ``weakest_over_edge`` and ``bulk_top_over_edge``).
    noise_note
        What the spectrum says of the noise, in words.
    stray_zeros
        SPEAR++: per sample, the share of its column's zeros on neurons its input activates at
        the sent weights (:func:`attacks.spearpp.solve.stray_zeros`; 0 for a one-step update's
        true column, about half for a mix of columns). Above 0.1 anywhere, nothing in the batch
        is certified by its columns.
    """

    inputs: torch.Tensor
    batch_size: int
    batch_size_method: str
    status: Status
    confidence: torch.Tensor
    verified: torch.Tensor
    certified: torch.Tensor
    timings: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    noise_declared: float | None = None
    noise_std_estimated: float | None = None
    noise_std_used: float = 0.0
    undeclared_noise: bool = False
    batch_size_confidence: float = 1.0
    spectrum: dict[str, float] = field(default_factory=dict)
    noise_note: str = ""
    stray_zeros: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))

    def summary(self) -> dict[str, Any]:
        """Everything but the inputs, as JSON-ready values."""
        return {
            "batch_size": self.batch_size,
            "batch_size_method": self.batch_size_method,
            "status": self.status,
            "reason": self.reason,
            "verified": int(self.verified.sum()),
            "certified": int(self.certified.sum()),
            "confidence_mean": float(self.confidence.mean()) if self.batch_size else 0.0,
            "stray_zeros_max": float(self.stray_zeros.max()) if len(self.stray_zeros) else None,
            "batch_size_confidence": self.batch_size_confidence,
            "noise_declared": self.noise_declared,
            "noise_std_estimated": self.noise_std_estimated,
            "noise_std_used": self.noise_std_used,
            "undeclared_noise": self.undeclared_noise,
            "noise_note": self.noise_note,
            "spectrum": dict(self.spectrum),
            "timings": dict(self.timings),
            "counts": dict(self.counts),
            "settings": dict(self.settings),
        }
