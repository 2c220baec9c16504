"""Settings of the optimisation-based attack: one immutable object, validated on construction.

:class:`InversionSettings` holds how the attack optimises, whichever gradient distance and seed
a run uses; :class:`InversionConfig` adds those two. Whoever configures runs of the attack (the
audit's ``[audit.inversion]`` table) extends :class:`InversionSettings` rather than repeating it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from attacks.spearpp.inputs import Device

Loss = Literal["l2", "cosine"]

LOSSES: tuple[str, ...] = ("l2", "cosine")


class InversionSettings(BaseModel):
    """How the gradient-matching attack ("Inverting Gradients" family) optimises.

    Parameters
    ----------
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
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    restarts: Annotated[int, Field(ge=1)] = 2
    iterations: Annotated[int, Field(ge=1)] = 1000
    lr: Annotated[float, Field(gt=0)] = 0.1
    tv: Annotated[float, Field(ge=0)] = 1e-4
    signed: bool = True
    dtype: Literal["float32", "float64"] = "float32"
    device: Device = "auto"


class InversionConfig(InversionSettings):
    """One run of the attack: :class:`InversionSettings` with its gradient distance and seed.

    Parameters
    ----------
    loss
        Gradient distance: ``l2`` (``||g(x) - g*||^2``, as DLG) or ``cosine``
        (``1 - cos(g(x), g*)`` over all parameters at once, as Inverting Gradients).
    seed
        Seed of the random starts.
    """

    loss: Loss = "cosine"
    seed: int = 0

    @field_validator("loss", mode="before")
    @classmethod
    def _loss(cls, loss: Any) -> Any:
        if loss not in LOSSES:
            raise ValueError(f"loss={loss!r}: allowed are {', '.join(LOSSES)}")
        return loss

    def replace(self, **changes: Any) -> InversionConfig:
        """A copy with ``changes`` applied (validated again)."""
        return InversionConfig.model_validate({**self.model_dump(), **changes})

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain values, for results and logs."""
        return self.model_dump()
