"""``fl-sim bench attack``: build client updates on real images, attack them, score them.

Ground truth stays here (the judge's side); the attack sees the gradient-equivalent of the
first layer's update, the weights sent, and what the case lets the client declare.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks import AttackInputError, Reconstruction, reconstruct
from clients import train_locally
from fl_sim.audit.metrics import NEAR_EXACT_DB, judge_certificates, match_and_score, psnr
from fl_sim.bench.attack_table import aggregate, markdown
from fl_sim.bench.cases import AttackCase
from fl_sim.bench.converge import TrainedNetwork
from fl_sim.bench.machine import hardware
from fl_sim.data.cifar10 import ImageSet
from fl_sim.data.normalize import Normalization, per_entry, to_unit
from fl_sim.model import fc_relu_net, first_linear, next_linear
from strategies import update_as_gradient

log = logging.getLogger(__name__)


def client_update(
    case: AttackCase,
    seed: int,
    data: ImageSet | None,
    norm: Normalization,
    dtype: torch.dtype,
    network: TrainedNetwork | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, float]:
    """One client's first-layer observation for ``case`` and ``seed``, and the true batch
    (from ``data``, or the case's tabular set; the network's weights from ``network`` when
    given, trained elsewhere).

    Returns the server's view (``grad_weight``, ``grad_bias``, ``weight``, ``bias``, and for a
    one-step update, as the audit gives it, ``next_grad_weight``, ``next_grad_bias`` and the
    next layer's weight as sent, ``next_weight``),
    in the form ``case.arrays`` asks for, the true samples on their [0, 1] scale (B x sample
    shape: 3 x 32 x 32 for images) and the per-entry noise std of the gradient-equivalent.
    """
    norm = case.normalization(norm)
    records = case.samples(data)
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(records.labels), case.batch_size, replace=False)
    images = to_unit(records.records[idx], records.low, records.high, dtype)
    labels = torch.from_numpy(records.labels[idx])
    torch.manual_seed(seed)
    model = fc_relu_net(
        case.width, case.depth, input_dim=images[0].numel(), num_classes=records.num_classes
    )
    if network is not None:
        model.load_state_dict(network.state)
    model = model.to(dtype)
    if case.pretrain.steps:
        everything = to_unit(records.records, records.low, records.high, dtype)
        case.pretrain.apply(
            model, norm.apply(everything), torch.from_numpy(records.labels).long(), idx, seed
        )
    _, layer = first_linear(model)
    found = next_linear(model)
    if found is None:
        raise ValueError(
            f"case {case.name!r}: depth {case.depth} has no linear layer after the first"
        )
    nxt = found[1]
    params = (layer.weight, layer.bias, nxt.weight, nxt.bias)
    sent = [p.detach().clone() for p in params]
    gen = torch.Generator().manual_seed(seed)
    result = train_locally(model, norm.apply(images), labels, case.training, gen)
    if case.arrays == "float64-diff":
        sent, after = [p.double() for p in sent], [p.detach().double() for p in params]
    else:
        after = [p.detach() for p in params]
    grads = [
        update_as_gradient(before, now, case.training.lr)
        for before, now in zip(sent, after, strict=True)
    ]
    view = {"grad_weight": grads[0], "grad_bias": grads[1], "weight": sent[0], "bias": sent[1]}
    if result.steps == 1:
        view |= {"next_grad_weight": grads[2], "next_grad_bias": grads[3], "next_weight": sent[2]}
    if case.arrays != "tensors":
        view = {k: v.double() for k, v in view.items()}
    return view, images, result.noise_std


def near_exact_at_true_scale(
    inputs: torch.Tensor, images: torch.Tensor, match: np.ndarray, norm: Normalization
) -> float:
    """Share of true samples at >= 40 dB once each matched reconstruction is rescaled by its
    least-squares scale to the truth (in the attack's input space).

    A judge's diagnostic: the engine fixes each sample's scale from the bias gradients, so
    under noise this tells a wrong scale from wrong pixels.
    """
    if not len(inputs):
        return 0.0
    truth = norm.apply(images).flatten(1)
    ok = torch.from_numpy(match >= 0)
    rec = inputs[torch.from_numpy(match.clip(min=0))].flatten(1)
    scale = (rec * truth).sum(1) / rec.square().sum(1).clamp_min(torch.finfo(rec.dtype).tiny)
    pixels = norm.undo((rec * scale[:, None]).reshape(images.shape))
    return float(((psnr(pixels, images) >= NEAR_EXACT_DB) & ok).double().mean())


def scale_bound(
    grad_weight: torch.Tensor, images: torch.Tensor, norm: Normalization, noise_std: float
) -> float:
    """Expected share of samples at >= 40 dB if every column were exact and each sample's
    scale were the least-squares fit to a bias gradient carrying i.i.d. noise of ``noise_std``
    per entry: what the first layer's bias gradient alone allows any unbiased scale estimate
    (a judge's bound; the next layer's gradient, when the engine has it, does better).

    The true columns are the update's dW X^+ (X the true inputs); a relative scale error e
    moves the pixels by e (p - mean), so sample i is near-exact when |e| <= 0.01 / rms(p_i -
    mean); e is normal with covariance noise_std^2 (G^T G)^-1.
    """
    inputs = norm.apply(images).flatten(1).to(grad_weight.dtype)
    columns = grad_weight @ torch.linalg.pinv(inputs)
    std = noise_std * torch.linalg.inv(columns.T @ columns).diagonal().sqrt()
    mean = per_entry(norm.mean, images, norm.ndim)
    spread = (images - mean).flatten(1).square().mean(1).sqrt().to(std.dtype)
    tolerance = 10 ** (-NEAR_EXACT_DB / 20) / spread
    return float(torch.special.erf(tolerance / (math.sqrt(2) * std)).mean())


def refused(err: AttackInputError, input_dim: int) -> Reconstruction:
    """What a refused attack holds: nothing (a result, as the audit records it: a float32
    update's round-off can fill the rank of a gradient on few features)."""
    return Reconstruction(
        inputs=torch.zeros(0, input_dim, dtype=torch.float64),
        batch_size=getattr(err, "batch_size_estimated", 0),
        batch_size_method="refused",
        status="failed",
        confidence=torch.zeros(0, dtype=torch.float64),
        verified=torch.zeros(0, dtype=torch.bool),
        certified=torch.zeros(0, dtype=torch.bool),
        reason=f"refused: {err}",
    )


def svd_seconds(grad_weight: Any) -> float:
    """Seconds of one full float64 SVD (thin, ``torch.linalg.svd``) of ``grad_weight``: the
    yardstick the attack's time is given in."""
    matrix = torch.as_tensor(grad_weight).to(torch.float64)
    start = time.perf_counter()
    torch.linalg.svd(matrix, full_matrices=False)
    return time.perf_counter() - start


def run_case(
    case: AttackCase,
    seed: int,
    data: ImageSet | None,
    norm: Normalization,
    dtype: torch.dtype,
    svd_reference: bool = False,
    train: ImageSet | None = None,
) -> dict[str, Any]:
    """Attack one seed of ``case`` on a batch of ``data``; the row of results (with
    ``svd_reference``, also the seconds of one full SVD of the same gradient, timed right after
    the attack). A converged case trains its network on ``train`` (``data``: its test split)
    and, with ``own_images``, attacks a batch of ``train``."""
    dtype = getattr(torch, case.dtype) if case.dtype else dtype
    network, converged = None, None
    if case.converged is not None:
        if train is None or data is None:
            raise ValueError(
                f"case {case.name!r} trains its network on a training split and tests it on "
                "the bench's images: pass both"
            )
        network = case.converged.network(
            case.width, case.depth, seed, train, data, case.normalization(norm)
        )
        converged = {
            **asdict(case.converged),
            "test_accuracy": network.test_accuracy,
            "train_accuracy": network.train_accuracy,
            "training_seconds": network.seconds,
            "own_images": case.own_images,
        }
    batches = train if case.own_images and train is not None else data
    view, images, noise_std = client_update(case, seed, batches, norm, dtype, network)
    norm = case.normalization(norm)
    # float64 arrays: as numpy code hands them over (the attack sees no tensor dtype).
    arrays = {k: v.numpy() if case.arrays != "tensors" else v for k, v in view.items()}
    start = time.perf_counter()
    try:
        rec = reconstruct(
            arrays["grad_weight"],
            arrays["grad_bias"],
            arrays["weight"],
            arrays["bias"],
            batch_size=case.batch_size if case.knows_batch_size else None,
            noise_std=noise_std if (case.knows_noise and noise_std) else None,
            next_layer=(arrays["next_grad_weight"], arrays["next_grad_bias"], arrays["next_weight"])
            if "next_grad_weight" in arrays
            else None,
            config=case.attack.replace(seed=seed),
        )
    except AttackInputError as err:
        rec = refused(err, images[0].numel())
    seconds = time.perf_counter() - start
    pixels = norm.undo(rec.inputs.reshape(-1, *images.shape[1:]))
    quality = match_and_score(pixels, images.to(torch.float64))
    return {
        "case": case.name,
        "seed": seed,
        "batch_size": case.batch_size,
        "width": case.width,
        "depth": case.depth,
        "pretrain": asdict(case.pretrain),
        "converged": converged,
        "centred": case.centred,
        "dataset": case.dataset,
        "defence": case.training.model_dump(),
        "dtype": str(dtype).removeprefix("torch."),
        "arrays": case.arrays,
        "noise_told": case.knows_noise,
        "noise_std": noise_std,
        # How far the spectrum's noise estimate is from the truth (None without either).
        "noise_estimate_error": (
            rec.noise_std_estimated / noise_std - 1
            if noise_std and rec.noise_std_estimated is not None
            else None
        ),
        "seconds": seconds,
        **quality.summary(),
        **judge_certificates(pixels, images, rec.certified),
        "share_near_exact_true_scale": near_exact_at_true_scale(
            rec.inputs, images.to(torch.float64), quality.match, norm
        ),
        "near_exact_scale_bound": (
            scale_bound(view["grad_weight"], images.to(torch.float64), norm, noise_std)
            if noise_std
            else None
        ),
        "attack": rec.summary(),
        "svd_seconds": svd_seconds(arrays["grad_weight"]) if svd_reference else None,
    }


def run_bench(
    cases: Iterable[AttackCase],
    data: ImageSet | None,
    out: Path,
    *,
    dtype: torch.dtype = torch.float64,
    command: str = "",
    svd_reference: bool = False,
    train: ImageSet | None = None,
) -> list[dict[str, Any]]:
    """Run every case and seed on batches of ``data`` (``None``: every case attacks a tabular
    set; converged cases train on ``train``);
    rows are appended to ``out/rows.jsonl`` as they finish, and ``out/summary.json`` and
    ``out/summary.md`` are rewritten after each case."""
    cases = list(cases)
    out.mkdir(parents=True, exist_ok=True)
    norm = Normalization()
    meta: dict[str, Any] = {
        "hardware": hardware(),
        "data": ", ".join(sorted({c.samples(data).source for c in cases})),
        "dtype": str(dtype).removeprefix("torch."),
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    summaries: list[dict[str, Any]] = []
    paper: dict[str, str] = {}
    for case in cases:
        rows = []
        for seed in case.seeds:
            row = run_case(case, seed, data, norm, dtype, svd_reference, train)
            rows.append(row)
            with (out / "rows.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            log.info(
                "%s seed %d: %s, B_hat %d, PSNR mean %.1f, exact %.0f%%, %.1f s",
                case.name,
                seed,
                row["attack"]["status"],
                row["attack"]["batch_size"],
                row["psnr_mean"],
                100 * row["share_exact"],
                row["seconds"],
            )
        summaries.append(aggregate(rows))
        paper[case.name] = case.paper
        meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        (out / "summary.json").write_text(
            json.dumps({"meta": meta, "cases": summaries}, indent=2, allow_nan=False)
        )
        (out / "summary.md").write_text(markdown(summaries, paper, meta))
    if not all(math.isfinite(s["psnr_mean"]) for s in summaries):
        raise ValueError(f"a case's mean PSNR is not finite: see {out / 'rows.jsonl'}")
    return summaries
