"""Found samples' input coordinates from the next layer's gradient: exact on one step, refused
where the hidden vectors do not span B dimensions; the certificate it gives each input."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attacks import SpearConfig, reconstruct
from attacks.spearpp.coupled import COUPLING_GAP
from attacks.spearpp.hidden import (
    RESIDUAL,
    InputSpan,
    column_inputs,
    column_patterns,
    confirmed_inputs,
    hidden_inputs,
    next_layer_bases,
)
from attacks.spearpp.inputs import NextLayer
from attacks.spearpp.signs import SignGeometry
from attacks.spearpp.solve import STRAY_MAX
from fl_sim.model import fc_relu_net
from tests.helpers import sgd_steps


def _update(
    seed: int, steps: int = 1, b: int = 8, n: int = 40, m: int = 60, shift: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, NextLayer, torch.Tensor]:
    """A depth-3 network's inputs (B x n, ``shift`` added: un-centred inputs), its first layer's
    affine map [W, b] (m x (n + 1)) as sent, and the next layer's gradient-equivalent of
    ``steps`` SGD steps on the batch."""
    x, sent, grads = sgd_steps(seed, b, n, m, steps, shift)
    affine = torch.cat([sent[0], sent[1][:, None]], dim=1)
    nxt = NextLayer(grads[2], grads[3])
    return x, affine, nxt, (x @ affine[:, :-1].T + affine[:, -1]) > 0


def hidden_space(nxt: NextLayer, b: int) -> torch.Tensor | None:
    """The next layer's row space where its rank is ``b`` exactly, else ``None``."""
    bases = next_layer_bases(nxt, b)
    return None if bases is None else bases.rows


def _spanned(
    seed: int, shift: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A one-step update's inputs, first layer [W, b], activity patterns and the next layer's
    row space (which one step always has)."""
    x, affine, nxt, active = _update(seed, shift=shift)
    space = hidden_space(nxt, x.shape[0])
    assert space is not None
    return x, affine, active, space


def _coordinates(x: torch.Tensor, affine: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[A, b] in coordinates of the inputs' span (V: n x B) and the inputs' coordinates."""
    basis = torch.linalg.qr(x.T).Q
    return torch.cat([affine[:, :-1] @ basis, affine[:, -1:]], dim=1), x @ basis


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_one_step_gives_every_sample_exactly(seed: int, shift: float) -> None:
    x, affine, active, space = _spanned(seed, shift)
    pre, truth = _coordinates(x, affine)
    coords, residual = hidden_inputs(pre, active, space)
    assert (residual < 1e-10).all()
    torch.testing.assert_close(coords, truth, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_mixed_pattern_leaves_a_residual(seed: int) -> None:
    """A mix of two columns is zero where both samples are: the union of their patterns."""
    x, affine, active, space = _spanned(seed)
    pre, _ = _coordinates(x, affine)
    mixes = torch.stack([active[i] | active[i + 1] for i in range(x.shape[0] - 1)])
    _, residual = hidden_inputs(pre, mixes, space)
    assert (residual > 1e3 * RESIDUAL).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_several_steps_give_no_estimate(seed: int) -> None:
    """Three steps' hidden vectors move: no B-dimensional space holds them, so either no space
    is found or no pattern fits it."""
    x, affine, nxt, active = _update(seed, steps=3)
    space = hidden_space(nxt, x.shape[0])
    if space is not None:
        pre, _ = _coordinates(x, affine)
        _, residual = hidden_inputs(pre, active, space)
        assert (residual >= RESIDUAL).all()


def test_a_next_layer_narrower_than_the_batch_gives_no_space() -> None:
    _, _, nxt, _ = _update(0, b=8)
    assert hidden_space(NextLayer(nxt.grad_weight[:5], nxt.grad_bias[:5]), 8) is None
    assert hidden_space(nxt, 9) is None  # rank 8 where 9 samples are claimed


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_takes_the_next_layer_on_every_view(seed: int) -> None:
    """Un-centred inputs leave neurons silent, so the search runs on the live rows too, where
    the row space is restricted to them: every sample comes back exact."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = fc_relu_net(120, 3, input_dim=50).double()
    x = torch.rand(12, 50, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (12,), generator=gen)
    torch.nn.functional.cross_entropy(net(x), y).backward()
    first, second = net[1], net[3]
    assert first.weight.grad is not None and second.weight.grad is not None
    rec = reconstruct(
        first.weight.grad,
        first.bias.grad,
        first.weight.detach(),
        first.bias.detach(),
        next_layer=(second.weight.grad, second.bias.grad),
        config=SpearConfig(seed=seed),
    )
    assert rec.status == "exact"
    error = (rec.inputs[:, None] - x[None]).norm(dim=2).amin(dim=0)
    assert float(error.max()) < 1e-8


def _geometry(x: torch.Tensor, affine: torch.Tensor) -> tuple[SignGeometry, torch.Tensor]:
    """The sign geometry of the first layer as sent over the inputs' span, and that span
    (B x n, orthonormal rows), as the gradient's right factor gives it (the left factor is not
    used here)."""
    right = torch.linalg.qr(x.T).Q.T
    left = torch.zeros(affine.shape[0], x.shape[0], dtype=x.dtype)
    return SignGeometry.build(left, right, affine[:, :-1], affine[:, -1]), right


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_row_space_confirms_every_true_input(seed: int) -> None:
    x, affine, _, space = _spanned(seed)
    geom, right = _geometry(x, affine)
    found, held, confirmed = confirmed_inputs(x, InputSpan.of(geom, right), space)
    assert bool(held.all()) and bool(confirmed.all())
    torch.testing.assert_close(found, x, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_blend_is_refused_and_a_nearly_right_input_corrected_but_not_confirmed(
    seed: int,
) -> None:
    x, affine, _, space = _spanned(seed)
    geom, right = _geometry(x, affine)
    given = x.clone()
    given[0] = 0.6 * x[0] + 0.4 * x[1]
    # Off by 1e-4 of its norm within the batch's span: the same active neurons, another input.
    given[2] = x[2] + 1e-4 * x[2].norm() * torch.nn.functional.normalize(x[3] - x[4], dim=0)
    weight, bias = affine[:, :-1], affine[:, -1]
    assert bool((((given[2] @ weight.T + bias) > 0) == ((x[2] @ weight.T + bias) > 0)).all())
    found, held, confirmed = confirmed_inputs(given, InputSpan.of(geom, right), space)
    assert not bool(held[0]) and not bool(confirmed[0])
    assert bool(held[2]) and not bool(confirmed[2])
    torch.testing.assert_close(found[2], x[2], rtol=1e-8, atol=1e-8)
    assert bool(confirmed[3:].all())


def _tilted_columns(active: torch.Tensor, tilt: float, seed: int) -> torch.Tensor:
    """Columns on ``active`` (c x m) from 1e-3 to 1 of their largest entry, ``tilt`` times
    random entries elsewhere (the samples fading past B_hat leave that), a few exactly 0."""
    gen = torch.Generator().manual_seed(seed)
    size = 10 ** (-3 * torch.rand(active.shape, generator=gen, dtype=torch.float64))
    off = tilt * torch.rand(active.shape, generator=gen, dtype=torch.float64)
    off[:, :3] = 0.0
    sign = torch.randn(active.shape, generator=gen, dtype=torch.float64).sign()
    return sign * torch.where(active, size, off)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_column_tilted_over_the_zero_floor_still_gives_its_pattern(seed: int) -> None:
    _, _, active, _ = _spanned(seed)
    patterns = column_patterns(_tilted_columns(active, 1e-6, seed), 3)
    assert bool((patterns[0] == active).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_column_gives_its_sample_where_the_inputs_from_the_columns_are_off(
    seed: int,
) -> None:
    """Every input from the columns tilted towards sample 0 (a strong sample whose column was
    missed): no input's pattern is its sample's, so the row space holds none of them; each
    column's own zeros give its sample exactly, and a mix of two columns gives nothing."""
    x, affine, active, space = _spanned(seed)
    geom, right = _geometry(x, affine)
    span = InputSpan.of(geom, right)
    tilted = (x + 0.5 * x[0]) / 1.5
    assert not bool(confirmed_inputs(tilted, span, space)[1][1:].any())
    found, held = column_inputs(_tilted_columns(active, 1e-6, seed), span, space)
    assert bool(held.all())
    torch.testing.assert_close(found, x, rtol=1e-8, atol=1e-8)
    mixes = torch.stack([active[i] | active[i + 1] for i in range(x.shape[0] - 1)])
    assert not bool(column_inputs(_tilted_columns(mixes, 1e-6, seed), span, space)[1].any())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_several_steps_confirm_nothing(seed: int) -> None:
    x, affine, nxt, _ = _update(seed, steps=3)
    space = hidden_space(nxt, x.shape[0])
    if space is not None:
        geom, right = _geometry(x, affine)
        assert not bool(confirmed_inputs(x, InputSpan.of(geom, right), space)[2].any())


def _weak_sample(seed: int, weak: float, b: int = 12) -> dict[str, torch.Tensor]:
    """A one-step update whose sample 0 reaches both layers ``weak`` times as strongly as the
    others (a memorised network's well-fitted sample: 1e-10 to 1e-9 measured): per-sample
    gradients D_i v_i at the first layer and w_i at the next, with h_i as its input."""
    gen = torch.Generator().manual_seed(seed)
    n, m, m2 = 60, 120, 80
    weight = torch.randn(m, n, generator=gen, dtype=torch.float64) / n**0.5
    bias = 0.1 * torch.randn(m, generator=gen, dtype=torch.float64)
    x = torch.randn(b, n, generator=gen, dtype=torch.float64)
    pre = x @ weight.T + bias
    strength = torch.ones(b, dtype=torch.float64)
    strength[0] = weak
    dz = (pre > 0) * torch.randn(b, m, generator=gen, dtype=torch.float64) * strength[:, None]
    w = torch.randn(b, m2, generator=gen, dtype=torch.float64) * strength[:, None]
    return {
        "grad_weight": dz.T @ x,
        "grad_bias": dz.sum(0),
        "weight": weight,
        "bias": bias,
        "next_grad_weight": w.T @ torch.relu(pre),
        "next_grad_bias": w.sum(0),
        "x": x,
    }


def _attack(view: dict[str, torch.Tensor], nxt: dict[str, torch.Tensor], seed: int) -> Any:
    return reconstruct(
        view["grad_weight"],
        view["grad_bias"],
        view["weight"],
        view["bias"],
        next_layer=(nxt["next_grad_weight"], nxt["next_grad_bias"]),
        config=SpearConfig(seed=seed),
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_sample_too_weak_to_pin_exactly_no_longer_withholds_the_others(seed: int) -> None:
    """At 1e-10 of the others the weak sample's column is known to about 1e-6 (the factors'
    round-off over its singular value): verified at that round-off (the zero rule's floor),
    its input is off by about 1e-5 and stays uncertified, while the eleven others are certified
    exact, with this batch's next layer or another's, which confirms none of them."""
    view = _weak_sample(seed, 1e-10)
    for nxt in (view, _weak_sample(seed + 1, 1e-10)):
        rec = _attack(view, nxt, seed)
        assert rec.status == "partial" and int(rec.verified.sum()) == 12
        assert int(rec.certified.sum()) == 11 and rec.counts["next_layer_certified"] == 0
        error = (rec.inputs[:, None] - view["x"][None]).norm(dim=2).amin(dim=1)
        scale = float(view["x"].norm(dim=1).min())
        assert float(error[rec.certified].max()) < 1e-10 * scale
        assert 1e-10 * scale < float(error[~rec.certified].max()) < 1e-3 * scale


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bases_up_to_noise_for_the_coupled_search(seed: int) -> None:
    """A rank-8 gradient under noise of a thousandth of its entries (a gap of ~200, as float32
    round-off leaves one): the exact rank test turns it away, the coupled search's gap takes
    it, and its row space is the noiseless one's up to the noise."""
    g = torch.Generator().manual_seed(seed)
    low = torch.randn(60, 8, generator=g, dtype=torch.float64) @ torch.randn(
        8, 50, generator=g, dtype=torch.float64
    )
    noisy = low + 3e-3 * torch.randn(60, 50, generator=g, dtype=torch.float64)
    bias = torch.zeros(60, dtype=torch.float64)
    assert next_layer_bases(NextLayer(noisy, bias), 8) is None
    bases = next_layer_bases(NextLayer(noisy, bias), 8, COUPLING_GAP)
    assert bases is not None and not bases.exact
    rows = torch.linalg.svd(low, full_matrices=False).Vh[:8].T
    assert float(torch.linalg.svdvals(rows.T @ bases.rows).min()) > 0.999
    exact = next_layer_bases(NextLayer(low, bias), 8)
    assert exact is not None and exact.exact


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_zeros_on_active_neurons_leave_the_row_space_to_certify(seed: int) -> None:
    """Sample 0's column vanishes on a third of the neurons its input activates (as a mix's
    does), so no sample is certified through its column; the next layer's row space still
    confirms each input on its own: all twelve with this batch's next layer (the batch is
    then exact), none with another's."""
    view = _weak_sample(seed, 1.0)
    gen = torch.Generator().manual_seed(seed + 100)
    pre = view["x"] @ view["weight"].T + view["bias"]
    silent = (pre[0] > 0) & (torch.rand(pre.shape[1], generator=gen) < 1 / 3)
    dz = torch.linalg.lstsq(view["x"].T, view["grad_weight"].T).solution  # B x m, exact
    dz[0, silent] = 0.0
    view = view | {"grad_weight": dz.T @ view["x"], "grad_bias": dz.sum(0)}
    for nxt, certified in ((view, 12), (_weak_sample(seed + 1, 1.0), 0)):
        rec = _attack(view, nxt, seed)
        assert float(rec.stray_zeros[0]) > STRAY_MAX
        if not certified:
            assert rec.reason.startswith("not identifiable from this update"), rec.reason
        assert rec.status == ("exact" if certified else "partial")
        assert int(rec.certified.sum()) == certified
        assert rec.counts["next_layer_certified"] == certified
        error = (rec.inputs[:, None] - view["x"][None]).norm(dim=2).amin(dim=1)
        assert bool((error[rec.certified] < 1e-10 * float(view["x"].norm())).all())
