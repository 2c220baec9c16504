"""Samples a single neuron gives away: where only sample i activates neuron j, row j of dL/dW
is dL/db_j times x_i, so x_i = dW_j / db_j exactly, whatever else of the batch is missing.

Two neurons isolating the same sample give the same ratio; two neurons shared by several
samples give equal ratios only by accident (their samples' output gradients would have to be
proportional across both), so a ratio that at least two neurons agree on, to round-off, is
certified as one sample. On a network at initialisation such neurons are rare (each of B
samples alone with probability about 2^-B); on trained networks some neurons fire for few
samples, and a server that shapes the first layer (trap weights) makes them common.
"""

from __future__ import annotations

import torch

# Neurons whose bias gradient is this small next to the largest are left out: their ratio is
# round-off over round-off.
_SMALL_BIAS = 1e-6
# Random directions the ratios are projected on to find candidate pairs cheaply.
_SKETCH = 16
# Two neurons' ratios agree when their distance is this far below their size, relative to the
# gradient's own round-off.
_AGREE_FACTOR = 100.0
# With a float32 gradient's round-off known per entry, two ratios agree within this many of its
# standard deviations each (ratio error: round-off * sqrt(n + |ratio|^2) / |db_j|). The relative
# rule alone lets shared neurons of small float32 nets agree by accident: 16 inputs, 60
# neurons, 3 classes: two neurons active for samples {0, 3} within 1.3e-3 of each other, where
# the float32 tolerance was 1.2e-3 and truly isolating pairs agree within 2e-6.
_ROUNDOFF_SIGMAS = 6.0


def isolated_samples(
    grad_weight: torch.Tensor,
    grad_bias: torch.Tensor,
    precision: float,
    generator: torch.Generator,
    roundoff_std: float = 0.0,
) -> torch.Tensor:
    """The inputs (c x n) that at least two neurons each isolate, one row per distinct sample.

    Parameters
    ----------
    grad_weight, grad_bias
        The layer's gradient (m x n) and bias gradient (m), float64.
    precision
        Relative round-off of the gradient: ratios within ``_AGREE_FACTOR`` times it agree.
    generator
        Source of the sketch directions.
    roundoff_std
        Per-entry std of the gradient's noise or float32 round-off (0: none known): where
        given, ratios must also agree within the error it puts on them.
    """
    n = grad_weight.shape[1]
    empty = torch.zeros(0, n, dtype=grad_weight.dtype, device=grad_weight.device)
    big = grad_bias.abs() > _SMALL_BIAS * grad_bias.abs().max()
    if int(big.sum()) < 2:
        return empty
    ratios = grad_weight[big] / grad_bias[big, None]
    size = ratios.norm(dim=1)
    tol = _AGREE_FACTOR * precision * size
    if roundoff_std:
        spread = roundoff_std * (n + size**2).sqrt() / grad_bias[big].abs()
        tol = torch.minimum(tol, _ROUNDOFF_SIGMAS * spread)
    sketch = torch.randn(n, _SKETCH, generator=generator, dtype=ratios.dtype).to(ratios.device)
    sketch = sketch / n**0.5
    # Projections shrink distances, so every agreeing pair is a candidate; candidates are then
    # checked on the whole vectors.
    near = torch.cdist(ratios @ sketch, ratios @ sketch) <= 3 * torch.maximum(tol[:, None], tol)
    near.fill_diagonal_(False)
    found: list[torch.Tensor] = []
    taken = torch.zeros(len(ratios), dtype=torch.bool, device=ratios.device)
    for i in torch.nonzero(near.any(dim=1)).flatten().tolist():
        if taken[i]:
            continue
        partners = torch.nonzero(near[i]).flatten()
        dist = (ratios[partners] - ratios[i]).norm(dim=1)
        agree = partners[dist <= torch.maximum(tol[partners], tol[i])]
        if agree.numel():
            group = torch.cat([agree, torch.tensor([i], device=agree.device)])
            taken[group] = True
            found.append(ratios[group].mean(dim=0))
    return torch.stack(found) if found else empty


def with_isolated(
    inputs: torch.Tensor, isolated: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``inputs`` (B x n) with each isolated sample put in place of the reconstruction nearest
    to it in direction, and the mask of the samples so certified (B)."""
    inputs = inputs.clone()
    certified = torch.zeros(inputs.shape[0], dtype=torch.bool, device=inputs.device)
    if not isolated.shape[0] or not inputs.shape[0]:
        return inputs, certified
    cosine = (
        torch.nn.functional.normalize(isolated, dim=1)
        @ torch.nn.functional.normalize(inputs, dim=1).T
    )
    for i in cosine.amax(dim=1).argsort(descending=True).tolist():
        free = torch.where(certified, -torch.inf, cosine[i])
        row = int(free.argmax())
        if not certified[row]:
            inputs[row], certified[row] = isolated[i], True
    return inputs, certified
