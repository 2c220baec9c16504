"""Settings of the SPEAR++ engine: one immutable pydantic object, validated on construction
(a bad value raises a ``ValueError`` naming the key, the value and what is allowed)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from attacks.spearpp.inputs import Device
from flsim_plugins.settings import Settings, explain

Surrogate = Literal["l1", "logcosh", "l4"]
Optimiser = Literal["radam", "pgd"]
Refinement = Literal["auto", "kernel", "sampling", "none"]
Search = Literal["signs", "surrogate"]
NullStep = Literal["auto", "eigh", "inverse"]

AtLeastOne = Annotated[int, Field(ge=1)]
AtLeastZero = Annotated[int, Field(ge=0)]


class SpearConfig(Settings):
    """How SPEAR++ searches, refines and selects.

    Parameters
    ----------
    search
        ``signs`` (beyond the paper): first the sign-consistency search, which uses the layer's
        weights to tie each column's zeros to its sample's pre-activations (see
        :mod:`attacks.spearpp.signs`), then surrogate passes for any column still missing;
        ``surrogate``: the paper's search only.
    sign_starts
        Starts per round of the sign-consistency search.
    sign_iterations
        Label/null alternations per round.
    sign_patience
        Rounds in a row without a new column after which the surrogate passes take over.
    coupled_starts
        Starts per sign round of the coupled search (see :mod:`attacks.spearpp.coupled`),
        where a one-step update comes with the next layer's weight, in the rounds after one
        whose sign starts found no column; 0 turns it off.
    null_step
        How the sign search's null steps find their direction: ``eigh`` (the exact smallest
        eigenvector; on CUDA each call checks its error codes on the host), ``inverse``
        (warm-started inverse iteration by Cholesky solves: no host round trip in the search
        loop), or ``auto``: ``inverse``. Measured on the CPU since points leave the search once
        settled (2026-12-03): B=256, m=4000 in 41 s against 57 s; m=1000, B=140 on three seeds
        in 38 / 53 / 27 s against 49 / 83 / 33 s, and B=150 exact on all three seeds (``eigh``
        the evening before: two of three). Once, with every point run to the end, ``inverse``
        stalled one of three seeds of m=1000, B=110 that ``eigh`` solved. Unmeasured on a GPU.
    surrogate
        Sparsity surrogate minimised over the sphere: ``l1``, ``logcosh`` or ``l4`` (that is -l4).
    optimiser
        ``radam`` (geoopt's Riemannian Adam) or ``pgd`` (projected gradient descent).
    starts
        Random starts per pass; each pass is one batched search.
    steps
        Optimiser steps per pass.
    lr, lr_final
        Learning rate at the first and the last step (geometric decay in between).
    max_passes
        Passes of fresh starts, run until every column is found or this many have run.
    time_budget_s
        Stop starting passes once this many seconds have gone (``None``: no limit).
    budget_clock
        What the time budget counts: ``wall`` seconds, or ``cpu``: this process's CPU seconds
        per torch thread, which a busy machine does not use up (an audit beside a federation
        then finds the same columns whatever else shares the cores).
    refine
        How a converged start becomes an exact direction: ``kernel`` (the null direction of its
        smallest rows, checked to be one column and not a mix), ``sampling`` (the paper's rounding:
        kernels of random row subsets, then the same check), ``none`` (keep the optimiser's
        point, as the paper does for l1), or ``auto``: ``kernel`` for l1, ``sampling`` for the
        smooth surrogates, whose minima are only near-sparse.
    rounding_samples
        Row subsets tried per candidate by ``sampling``.
    logcosh_mu
        Smoothing of LogCosh, relative to the typical entry 1/sqrt(m) of a unit direction.
    harvest_every
        Every this many steps, converged starts are refined and removed, and starts that head
        for an already found column are dropped (0: only at the end of a pass, as in the paper).
    drop_cosine
        A start whose direction has at least this |cosine| with a found column is dropped.
    zero_tol
        Relative tolerance under which an entry of L q counts as zero (``None``: from the float
        precision, or from the noise level: ``noise_std`` when one is given, else the level
        fitted to the gradient's spectrum when it shows noise).
    split_mixtures
        Split candidates whose zero set is shared by a few columns into those columns.
    deflate
        Beyond the paper: passes after the first start orthogonal to the columns already found,
        and when only a few columns are missing, convex l1 searches on hyperplanes that exclude
        the found ones go after them.
    next_layer_scale
        Beyond the paper: when the next layer's gradient is given (one-step updates), fix each
        sample's scale from both layers' bias gradients rather than this layer's alone
        (:func:`attacks.spearpp.solve.next_layer_scales`); the paper uses this layer's only.
    search_dtype
        Precision of the search; refinement, scaling and the solve are always float64.
    device
        ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
    max_elements
        Bound on starts x m per batched product, so memory stays bounded.
    selection_sweeps
        Greedy swap sweeps of the sparsity-matching selection when more candidates than B exist.
    seed
        Seed of every random draw; equal seeds give equal results on the same device.
    """

    # Not strict, unlike a config table: a library's callers pass numpy integers and the like.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)

    search: Search = "signs"
    sign_starts: AtLeastOne = 8
    sign_iterations: AtLeastOne = 14
    sign_patience: AtLeastZero = 10
    coupled_starts: AtLeastZero = 8
    null_step: NullStep = "auto"
    surrogate: Surrogate = "l1"
    optimiser: Optimiser = "radam"
    starts: AtLeastOne = 2000
    steps: AtLeastOne = 1000
    lr: float = 0.1
    lr_final: float = 0.001
    max_passes: AtLeastOne = 8
    time_budget_s: Annotated[float, Field(gt=0)] | None = None
    budget_clock: Literal["wall", "cpu"] = "wall"
    refine: Refinement = "auto"
    rounding_samples: AtLeastOne = 50
    logcosh_mu: Annotated[float, Field(gt=0)] = 0.02
    harvest_every: AtLeastZero = 100
    drop_cosine: Annotated[float, Field(gt=0, le=1)] = 0.995
    zero_tol: Annotated[float, Field(gt=0, lt=1)] | None = None
    split_mixtures: bool = True
    deflate: bool = True
    next_layer_scale: bool = True
    search_dtype: Literal["float32", "float64"] = "float32"
    device: Device = "auto"
    max_elements: AtLeastOne = 16_000_000
    selection_sweeps: AtLeastZero = 2
    seed: int = 0

    def __init__(self, **settings: Any) -> None:
        try:
            super().__init__(**settings)
        except ValidationError as err:
            raise ValueError(explain(err, SpearConfig, prefix="SpearConfig.", sep="=")) from None

    @model_validator(mode="after")
    def _lr_schedule(self) -> SpearConfig:
        if not 0 < self.lr_final <= self.lr:
            raise ValueError(f"lr={self.lr!r}, lr_final={self.lr_final!r}: need 0 < lr_final <= lr")
        return self

    @property
    def refinement(self) -> str:
        """The refinement in effect (``auto`` resolved by surrogate)."""
        if self.refine != "auto":
            return self.refine
        return "kernel" if self.surrogate == "l1" else "sampling"

    def replace(self, **changes: Any) -> SpearConfig:
        """A copy with ``changes`` applied (validated again)."""
        return SpearConfig(**{**self.model_dump(), **changes})

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain values, for results and logs."""
        return self.model_dump()


def paper_config(surrogate: Surrogate = "l1", optimiser: Optimiser = "radam") -> SpearConfig:
    """The method as the SPEAR++ paper describes it.

    The surrogate search only, in one batched pass; candidates taken where the optimiser stopped
    (rounding via sampling for the smooth surrogates); no harvesting during the search, no
    mixture splitting, scales from the attacked layer's bias gradient only, float64 throughout.
    """
    return SpearConfig(
        search="surrogate",
        surrogate=surrogate,
        optimiser=optimiser,
        max_passes=1,
        refine="none" if surrogate == "l1" else "sampling",
        harvest_every=0,
        split_mixtures=False,
        deflate=False,
        next_layer_scale=False,
        search_dtype="float64",
    )


PRESETS: dict[str, SpearConfig] = {
    "fl-sim": SpearConfig(),
    "paper": paper_config(),
}
