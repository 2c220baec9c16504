"""Settings of the optimisation-based attack: one immutable object, validated on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

Loss = Literal["l2", "cosine"]

LOSSES: tuple[str, ...] = ("l2", "cosine")
_CHOICES: dict[str, tuple[str, ...]] = {"loss": LOSSES, "dtype": ("float32", "float64")}


@dataclass(frozen=True)
class InversionConfig:
    """How the gradient-matching attack ("Inverting Gradients" family) optimises.

    Parameters
    ----------
    loss
        Gradient distance: ``l2`` (``||g(x) - g*||^2``, as DLG) or ``cosine``
        (``1 - cos(g(x), g*)`` over all parameters at once, as Inverting Gradients).
    restarts
        Independent random starts per observation; the one whose gradient matches best is kept.
    iterations
        Adam steps per start.
    lr
        Adam's learning rate; divided by 10 at 3/8, 5/8 and 7/8 of the iterations.
    tv
        Weight of the total-variation prior (mean absolute difference of neighbouring pixels).
    signed
        Step on the sign of the input gradient, as Inverting Gradients does.
    dtype
        Precision of the optimisation (the observation is converted to it).
    device
        ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
    seed
        Seed of the random starts.
    """

    loss: Loss = "cosine"
    restarts: int = 2
    iterations: int = 1000
    lr: float = 0.1
    tv: float = 1e-4
    signed: bool = True
    dtype: Literal["float32", "float64"] = "float32"
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"InversionConfig.{name}={getattr(self, name)!r}: allowed are "
                    f"{', '.join(allowed)}"
                )
        for name in ("restarts", "iterations"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"InversionConfig.{name}={getattr(self, name)!r}: must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"InversionConfig.lr={self.lr!r}: must be > 0")
        if not self.tv >= 0:
            raise ValueError(f"InversionConfig.tv={self.tv!r}: must be >= 0")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(
                f"InversionConfig.device={self.device!r}: allowed are auto, cpu, cuda, cuda:N"
            )

    def replace(self, **changes: Any) -> InversionConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain values, for results and logs."""
        return dataclasses.asdict(self)
