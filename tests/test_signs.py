"""The sign-consistency search: max-margin input fits, deflation in both views, landing on
columns."""

from __future__ import annotations

import pytest
import torch

from attacks.spearpp import signs
from attacks.spearpp.factor import factorise
from attacks.spearpp.rounds import round_starts
from attacks.spearpp.search import random_starts
from attacks.spearpp.signs import (
    SignGeometry,
    deflation_basis,
    fit_inputs,
    halfspace_agreement,
    sign_search,
    smallest_eigenvectors,
)
from fl_sim.model import fc_relu_net
from tests.helpers import batch, sign_geometry


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1)


def _patterns(
    seed: int, rows: int, samples: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random A (rows x 20), true inputs (samples x 20) and their activity patterns."""
    gen = torch.Generator().manual_seed(seed)
    pre = torch.randn(rows, 20, generator=gen, dtype=torch.float64)
    truth = torch.randn(samples, 20, generator=gen, dtype=torch.float64)
    return pre, truth, truth @ pre.T > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_max_margin_fit_separates_and_beats_least_squares(seed: int) -> None:
    pre, truth, active = _patterns(seed, rows=600, samples=5)
    fit = fit_inputs(pre, active)
    assert ((fit @ pre.T > 0) == active).double().mean() >= 0.995
    signs = torch.where(active, 1.0, -1.0).to(torch.float64)
    least_squares = torch.linalg.lstsq(pre, signs.T).solution.T
    assert (_cosine(fit, truth) >= _cosine(least_squares, truth) - 1e-3).all()
    assert _cosine(fit, truth).min() > 0.98


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_max_margin_fit_from_the_rows_with_slack_is_the_full_fit(seed: int) -> None:
    """The CPU path builds each Newton step's Hessian from the rows with slack, updated by the
    rows that gain or lose it; the GPU path from every row: the same fits."""
    pre, _, active = _patterns(seed, rows=600, samples=7)
    gathered = fit_inputs(pre, active, gather=True)
    full = fit_inputs(pre, active, gather=False)
    assert torch.allclose(gathered, full, rtol=1e-9, atol=1e-9 * float(full.abs().max()))


@pytest.mark.parametrize("seed", [0, 1])
def test_points_whose_rows_repeat_leave_with_the_points_they_would_have_reached(
    seed: int,
) -> None:
    """Without deflation a point leaves a stage only once its null step's rows repeat, so the
    CPU path returns the points the full schedule does, or a true column where that one
    reached a column too (seed 1: one point of 16 lands on another column); with deflation it
    also leaves once it moves under half a degree, and lands on the same columns."""
    geom, truth, _ = sign_geometry(20, 200, seed)
    starts = random_starts(16, 20, torch.Generator().manual_seed(seed))
    kept = sign_search(geom, starts, None, 14, drop_fixed=False)
    dropped = sign_search(geom, starts, None, 14, drop_fixed=True)
    unit = torch.nn.functional.normalize(truth, dim=1)
    on_column = (kept @ unit.T).abs().amax(dim=1) > 1 - 1e-9
    assert torch.equal(on_column, (dropped @ unit.T).abs().amax(dim=1) > 1 - 1e-9)
    same = (kept - dropped).abs().amax(dim=1) <= 1e-12
    assert bool((same | on_column).all()) and int(same.sum()) >= len(same) - 1
    found = unit[:6]
    basis = torch.linalg.qr(torch.linalg.pinv(unit)[:, :6]).Q  # exact inputs of the found
    kept = sign_search(geom, starts, basis, 14, found, drop_fixed=False)
    dropped = sign_search(geom, starts, basis, 14, found, drop_fixed=True)
    hit_kept = (kept @ unit.T).abs().amax(dim=1) > 1 - 1e-9
    hit_dropped = (dropped @ unit.T).abs().amax(dim=1) > 1 - 1e-9
    assert int(hit_dropped.sum()) >= int(hit_kept.sum()) - 1 and bool(hit_dropped.any())


def test_the_rows_with_slack_are_gathered_a_chunk_of_patterns_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However few elements a chunk may hold, the fits are the same (a complement round's 2,000
    candidates at B=400, m=4000 gathered 23 GB at once and were killed)."""
    pre, _, active = _patterns(3, rows=600, samples=9)
    whole = fit_inputs(pre, active, gather=True)
    monkeypatch.setattr(signs, "GATHER_ELEMENTS", 600 * 20 * 2)  # two patterns per chunk
    chunked = fit_inputs(pre, active, gather=True)
    assert torch.allclose(chunked, whole, rtol=1e-12, atol=1e-12 * float(whole.abs().max()))


@pytest.mark.parametrize("gather", [False, True])
def test_fits_a_chunk_of_patterns_at_a_time_are_the_same_fits(
    monkeypatch: pytest.MonkeyPatch, gather: bool
) -> None:
    """Patterns are fitted in chunks (their B x B Hessians at once asked for 6.4 GB per copy at
    B=512, m=4000); each fit is its own, so the chunks must give the same fits."""
    pre, _, active = _patterns(4, rows=600, samples=9)
    whole = fit_inputs(pre, active, gather=gather)
    monkeypatch.setattr(signs, "FIT_ELEMENTS", 3 * pre.shape[1] ** 2)  # three per chunk
    chunked = fit_inputs(pre, active, gather=gather)
    assert chunked.shape == whole.shape
    assert torch.allclose(chunked, whole, rtol=1e-10, atol=1e-10 * float(whole.abs().max()))
    assert fit_inputs(pre, active[:0], gather=gather).shape == (0, pre.shape[1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deflation_basis_is_exact_for_true_inputs(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(12, 12, generator=gen, dtype=torch.float64))
    p = torch.linalg.inv(q.T)  # rows p_k with p_k . q_i = [k == i] (q's rows are the columns)
    found, unfound = q[:7], q[7:]
    basis = deflation_basis(found, p[:7])
    assert torch.allclose(basis.T @ basis, torch.eye(7, dtype=torch.float64), atol=1e-12)
    assert (unfound @ basis).abs().max() < 1e-10
    # Noisy estimates are pulled onto the constraints the true inputs meet: closer to the truth.
    noisy = p[:7] + 0.05 * p[:7].norm(dim=1, keepdim=True) * torch.randn(
        7, 12, generator=gen, dtype=torch.float64
    )
    raw = torch.linalg.qr(noisy.T).Q
    assert (unfound @ basis).abs().max() < 1e-10 or (
        (unfound @ deflation_basis(found, noisy)).norm() < (unfound @ raw).norm()
    )


def test_search_lands_on_true_columns() -> None:
    # The iteration is chaotic (where a start lands changes with the thread count's round-off),
    # so the count is taken over several batches.
    landed = []
    for seed in range(5):
        geom, truth, _ = sign_geometry(16, 300, seed)
        starts = random_starts(8, 16, torch.Generator().manual_seed(seed))
        points = sign_search(geom, starts, None, iterations=8)
        best = _cosine(points[:, None, :], truth[None]).abs().amax(dim=1)
        landed.append(int((best > 1 - 1e-9).sum()))
    assert min(landed) >= 4 and sum(landed) >= 34, landed


@pytest.mark.parametrize("seed", [0, 1])
def test_deflation_steers_to_unfound_columns(seed: int) -> None:
    geom, truth, _ = sign_geometry(16, 300, seed)
    inputs = torch.linalg.inv(truth.T)  # exact input coordinates, rows
    found = torch.arange(8)
    basis = deflation_basis(torch.nn.functional.normalize(truth[found]), inputs[found])
    starts = random_starts(8, 16, torch.Generator().manual_seed(seed))
    points = sign_search(geom, starts, basis, iterations=8)
    cos = _cosine(points[:, None, :], truth[None]).abs()
    landed = cos.amax(dim=1) > 1 - 1e-9
    assert landed.sum() >= 6
    assert (cos[landed].argmax(dim=1) >= 8).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_free_iterations_end_the_deflation(seed: int) -> None:
    """Every iteration free: the deflation changes nothing; none free: every point stays in
    the complement of the (here exact) found inputs, so none lands on a found column."""
    geom, truth, _ = sign_geometry(16, 300, seed)
    inputs = torch.linalg.inv(truth.T)
    found = torch.arange(8)
    basis = deflation_basis(torch.nn.functional.normalize(truth[found]), inputs[found])
    starts = random_starts(8, 16, torch.Generator().manual_seed(seed))
    free = sign_search(geom, starts, basis, iterations=8, free_iterations=8)
    assert torch.equal(free, sign_search(geom, starts, None, iterations=8))
    bound = sign_search(geom, starts, basis, iterations=8, free_iterations=0)
    # In the complement: q . p_k = 0 for every found sample k, as for every unfound column.
    outside = (bound @ inputs[found].T).abs().amax(dim=1)
    assert bool((outside < 1e-9).all())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_input_restriction_finds_the_last_similar_columns(seed: int) -> None:
    # Depth 2: the two most similar columns (same-label samples) are left unfound; mixes of
    # them are nearly as sparse as they are.
    geom, truth, out_grads = sign_geometry(24, 300, seed, depth=2)
    truth = torch.nn.functional.normalize(truth)
    similar = _cosine(out_grads[:, None, :], out_grads[None]).abs().fill_diagonal_(0)
    missing = divmod(int(similar.argmax()), 24)
    found = truth[[k for k in range(24) if k not in missing]]
    starts = random_starts(16, 24, torch.Generator().manual_seed(seed))

    def on_missing(points: torch.Tensor) -> tuple[int, int]:
        cos = _cosine(points[:, None, :], truth[None]).abs()
        landed = cos.amax(dim=1) > 1 - 1e-9
        return int(landed.sum()), sum(int(k) in missing for k in cos[landed].argmax(dim=1))

    # Found columns stay fixed points of the search (its labels follow each point's own zeros),
    # so some starts still land on them; the engine drops those as known.
    _, right = on_missing(sign_search(geom, starts, None, 8, found))
    assert right >= 4
    assert right > on_missing(sign_search(geom, starts, None, 8))[1]


def test_engine_coordinates_round_trip() -> None:
    geom, truth, _ = sign_geometry(8, 100, 0)
    unit = torch.nn.functional.normalize(truth)
    assert torch.allclose(geom.to_search(geom.to_engine(unit)), unit, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_halfspace_agreement_tells_columns_from_mixes(seed: int) -> None:
    pre, _truth, active = _patterns(seed, rows=400, samples=2)
    # A mix of two columns is zero only where both samples are inactive.
    mix = active[0] | active[1]
    score = halfspace_agreement(pre, torch.stack([active[0], active[1], mix]))
    assert score[:2].min() >= 0.995
    assert score[2] < 0.95


@pytest.mark.parametrize("seed", range(4))
def test_inverse_iteration_matches_eigh(seed: int) -> None:
    """The null step's fast path (Cholesky solves, no host sync) against the reference
    eigensolver, on Gram matrices of rows that nearly miss one direction, from random starts."""
    g = torch.Generator().manual_seed(seed)
    k, r, b = 6, 90, 30
    rows = torch.randn(k, r, b, generator=g, dtype=torch.float64)
    hidden = torch.nn.functional.normalize(torch.randn(k, b, generator=g, dtype=torch.float64))
    rows -= torch.einsum("krb,kb->kr", rows, hidden)[..., None] * hidden[:, None]
    rows += 1e-4 * torch.randn(k, r, b, generator=g, dtype=torch.float64)
    gram = rows.transpose(1, 2) @ rows
    start = torch.randn(k, b, generator=g, dtype=torch.float64)
    fast = smallest_eigenvectors(gram, start)
    reference = torch.linalg.eigh(gram)[1][:, :, 0]
    assert torch.allclose((fast * reference).sum(1).abs(), torch.ones(k, dtype=torch.float64))
    assert torch.allclose(fast.norm(dim=1), torch.ones(k, dtype=torch.float64))


def _irls_reference(
    rows: torch.Tensor, q: torch.Tensor, complement: torch.Tensor, use: torch.Tensor
) -> torch.Tensor:
    """The deflated null step as first written: each B x B Gram matrix projected onto the
    complement at every IRLS step, in full coordinates."""
    mask = use.to(rows.dtype)
    weights = mask
    for step in range(signs.IRLS_STEPS):
        if step:
            size = torch.einsum("krb,kb->kr", rows, q).abs()
            weights = mask / size.clamp_min(signs._IRLS_FLOOR * size.amax(dim=1, keepdim=True))
        gram = torch.einsum("krb,kr,krc->kbc", rows, weights, rows)
        inner = complement.T @ gram @ complement
        q = torch.linalg.eigh(inner)[1][:, :, 0] @ complement.T
    return q


@pytest.mark.parametrize("seed", range(4))
def test_deflated_null_step_on_projected_rows_is_the_projected_gram_step(seed: int) -> None:
    """Deflated null steps run on rows projected onto the complement once (K x r x c), not on
    each B x B Gram matrix projected per IRLS step: the same robust null direction, here one
    the rows nearly miss inside the complement, with a few rows left out."""
    g = torch.Generator().manual_seed(seed)
    k, r, b, c = 5, 80, 24, 15
    complement = torch.linalg.qr(torch.randn(b, c, generator=g, dtype=torch.float64)).Q
    hidden = torch.nn.functional.normalize(
        torch.randn(k, c, generator=g, dtype=torch.float64) @ complement.T
    )
    rows = torch.randn(k, r, b, generator=g, dtype=torch.float64)
    rows -= torch.einsum("krb,kb->kr", rows, hidden)[..., None] * hidden[:, None]
    rows += 1e-3 * torch.randn(k, r, b, generator=g, dtype=torch.float64)
    use = torch.rand(k, r, generator=g) > 0.1
    start = torch.randn(k, b, generator=g, dtype=torch.float64)
    step = signs._null_step(rows @ complement, start @ complement, signs._eigh_smallest, use)
    fast = step @ complement.T
    reference = _irls_reference(rows, start, complement, use)
    ones = torch.ones(k, dtype=torch.float64)
    assert torch.allclose(_cosine(fast, reference).abs(), ones, atol=1e-10)
    assert (_cosine(fast, hidden).abs() > 0.999).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_mix_of_two_columns_is_not_a_fixed_point(seed: int) -> None:
    # A mix's shared zeros are exact zeros too: labelled at their jump from the first
    # iteration on, 15 or 16 of 16 mixes stayed mixes (B=40, m=400), and at B=256, m=4000
    # rounds of 8 starts found 1 to 3 columns instead of 6 to 8.
    geom, truth, _ = sign_geometry(40, 400, seed)
    truth = torch.nn.functional.normalize(truth, dim=1)
    pairs = torch.randperm(40, generator=torch.Generator().manual_seed(seed))[:32].view(16, 2)
    mixes = torch.nn.functional.normalize(truth[pairs[:, 0]] + truth[pairs[:, 1]], dim=1)
    out = sign_search(geom, mixes, None, 14)
    assert bool(((out @ truth.T).abs().amax(dim=1) > 1 - 1e-9).all())


def _faint_samples_geometry(seed: int) -> tuple[SignGeometry, torch.Tensor]:
    """A FedSGD batch (B=30, m=200) whose samples' shares of the loss span 8 decades, as a
    memorised network's do: its geometry and true columns (search coordinates, unit rows),
    strongest first."""
    _, x, y = batch(30, seed)
    torch.manual_seed(seed)
    net = fc_relu_net(200, 3).double()
    z = net[1](x)
    z.retain_grad()
    share = 10 ** (-8 * torch.arange(30, dtype=torch.float64) / 29)
    (torch.nn.functional.cross_entropy(net[2:](z), y, reduction="none") * share).sum().backward()
    assert z.grad is not None and net[1].weight.grad is not None
    fac = factorise(
        net[1].weight.grad,
        batch_size=30,
        noise_std=None,
        precision=1e-15,
        generator=torch.Generator().manual_seed(seed),
    )
    geom = SignGeometry.build(fac.left, fac.right, net[1].weight.detach(), net[1].bias.detach())
    truth = torch.linalg.lstsq(geom.left, z.grad.T).solution.T
    return geom, torch.nn.functional.normalize(truth, dim=1)


def test_round_starts_reach_the_faint_samples_columns() -> None:
    # Starts uniform in the search's coordinates land near the strongest samples' columns;
    # half of them uniform in the engine's, on 1.7 times as many, the fainter half 2.3 times as
    # often (all of them: 1.8 and 2.8 times).
    reached = {True: [0, 0], False: [0, 0]}
    for seed in range(4):
        geom, truth = _faint_samples_geometry(seed)
        for engine in (True, False):
            starts = round_starts(geom, 60, torch.Generator().manual_seed(seed), engine)
            points = torch.nn.functional.normalize(sign_search(geom, starts, None, 14), dim=1)
            cosine, index = (points @ truth.T).abs().max(dim=1)
            hit = index[cosine > 1 - 1e-9].unique()
            reached[engine][0] += hit.numel()
            reached[engine][1] += int((hit >= 15).sum())
    (columns, faint), (before, faint_before) = reached[True], reached[False]
    assert columns >= 1.4 * before and faint >= 2 * faint_before, reached
