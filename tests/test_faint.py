"""Samples fainter than the batch size's rank (a memorised network's best-fitted ones): the
directions they add to the row-space fit, float64 over several seeds."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp.coupled import COUPLING_GAP
from attacks.spearpp.factor import factorise
from attacks.spearpp.faint import faint_count, with_faint
from attacks.spearpp.hidden import InputSpan, confirmed_inputs, next_layer_bases
from attacks.spearpp.inputs import NextLayer, gradient_precision
from attacks.spearpp.signs import SignGeometry

STRONG, FAINT = 12, 2


def _batch(seed: int) -> dict[str, torch.Tensor]:
    """A one-step update whose samples reach both layers at strengths from 1 down to 1e-10
    (counted in B_hat), and two more at 1e-14, a few decades above the round-off: per-sample
    gradients D_i v_i at the first layer and w_i at the next, with h_i its input."""
    gen = torch.Generator().manual_seed(seed)
    n, m, m2, b = 80, 200, 150, STRONG + FAINT
    weight = torch.randn(m, n, generator=gen, dtype=torch.float64) / n**0.5
    bias = 0.1 * torch.randn(m, generator=gen, dtype=torch.float64)
    x = torch.randn(b, n, generator=gen, dtype=torch.float64)
    pre = x @ weight.T + bias
    strength = torch.cat(
        [torch.logspace(0, -10, STRONG, dtype=torch.float64), torch.full((FAINT,), 1e-14)]
    )
    dz = (pre > 0) * torch.randn(b, m, generator=gen, dtype=torch.float64) * strength[:, None]
    w = torch.randn(b, m2, generator=gen, dtype=torch.float64) * strength[:, None]
    return {
        "grad": dz.T @ x,
        "weight": weight,
        "bias": bias,
        "next": w.T @ torch.relu(pre),
        "x": x,
    }


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_faint_samples_put_back_make_the_weakest_counted_input_exact(seed: int) -> None:
    """B_hat counts the twelve; left out, the two faint samples tilt both spans by their share
    over the weakest counted sample's (1e-14 over 1e-10), and its input from the row space comes
    back off by far more than its round-off; with their directions added, it is at that
    round-off."""
    batch = _batch(seed)
    fac = factorise(
        batch["grad"],
        batch_size=None,
        noise_std=None,
        precision=gradient_precision(batch["grad"])[0],
        generator=torch.Generator().manual_seed(seed),
    )
    assert fac.batch_size == STRONG
    count = faint_count(fac.singular_values, fac.batch_size)
    assert count == FAINT
    geom = SignGeometry.build(fac.left, fac.right, batch["weight"], batch["bias"])
    bases = next_layer_bases(
        NextLayer(batch["next"], torch.zeros(batch["next"].shape[0], dtype=torch.float64)),
        STRONG,
        COUPLING_GAP,
    )
    assert bases is not None
    x = batch["x"][:STRONG]
    errors, helds = [], []
    for added in (0, count):
        span, rows = with_faint(
            InputSpan.of(geom, fac.right),
            bases.rows,
            batch["grad"],
            batch["weight"],
            batch["next"],
            added,
        )
        assert span.basis.shape[0] == rows.shape[1] == STRONG + added
        found, held, _ = confirmed_inputs(x, span, rows)
        helds.append(int(held.sum()))
        errors.append((found - x).norm(dim=1) / x.norm(dim=1))
    # The weakest counted input is known only to the round-off over its strength (1e-16 over
    # 1e-10); the faint samples' tilt had put it 7 to 15 times further off.
    assert float(errors[1].max()) < 3e-6
    assert float(errors[1].max()) * 5 < float(errors[0].max())
    # The row-space test holds as many inputs, or more, with them (the weakest not: its
    # residual is its round-off, above the test's 1e-6).
    assert helds[0] <= helds[1] == STRONG - 1


def test_no_bulk_computed_counts_no_faint_sample() -> None:
    """A spectrum without a flat tail past the rank (too few values computed) has none."""
    values = torch.logspace(0, -12, 20, dtype=torch.float64)
    assert faint_count(values, 10) == 0
