"""The optimisation: random inputs whose gradient is driven onto the observed one.

Every trial (one observation, one restart) is an independent problem; ``torch.func.vmap`` runs
them all in one batched step, so several observations of the same weights (a benchmark's
samples) and the restarts of one cost about as much as their total work, not their number of
Python loops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from attacks.errors import AttackInputError
from attacks.inversion.config import InversionConfig
from attacks.inversion.distance import gradient_distance, total_variation
from attacks.inversion.labels import head_signal, recover_labels
from attacks.result import Reconstruction
from attacks.spearpp.inputs import ArrayLike, resolve_device

log = logging.getLogger(__name__)

# Learning-rate decays (x 0.1) at these shares of the iterations, as in Inverting Gradients.
_MILESTONES = (3 / 8, 5 / 8, 7 / 8)

Params = dict[str, torch.Tensor]


def _tensor(name: str, value: ArrayLike, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(value).detach()
    if not torch.isfinite(t).all():
        raise AttackInputError(f"{name} holds NaN or infinite values")
    return t.to(device=device, dtype=dtype)


def _checked_gradients(
    model: nn.Module,
    gradients: Sequence[Mapping[str, ArrayLike]],
    dtype: torch.dtype,
    device: torch.device,
) -> list[Params]:
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    out = []
    for i, gradient in enumerate(gradients):
        missing = sorted(set(shapes) - set(gradient))
        if missing:
            raise AttackInputError(f"gradient {i} lacks parameters {missing}")
        g = {k: _tensor(f"gradient {i} {k}", gradient[k], dtype, device) for k in shapes}
        for k, t in g.items():
            if tuple(t.shape) != shapes[k]:
                raise AttackInputError(
                    f"gradient {i} {k} has shape {tuple(t.shape)}, the model {shapes[k]}"
                )
        out.append(g)
    return out


def invert_gradients(
    model: nn.Module,
    weights: Mapping[str, ArrayLike],
    gradients: Sequence[Mapping[str, ArrayLike]],
    *,
    input_shape: tuple[int, ...],
    batch_size: int,
    labels: Sequence[Sequence[int]] | None = None,
    bounds: tuple[ArrayLike, ArrayLike] | None = None,
    batch_size_method: str = "declared",
    config: InversionConfig | None = None,
) -> list[Reconstruction]:
    """Reconstruct the batch behind each observed gradient of one model.

    Parameters
    ----------
    model
        The architecture the server built (its own parameter values are not used; a model on
        the ``meta`` device will do).
    weights
        Every parameter (and buffer) as the server sent it.
    gradients
        Observations of the same weights: per parameter, the gradient (for a multi-step
        update, the pseudo-gradient (sent - received) / lr, possibly averaged over the steps).
    input_shape
        Shape of one sample as the model takes it, e.g. ``(3, 32, 32)``.
    batch_size
        B: samples behind each observation (declared, or estimated by the caller).
    labels
        Per observation, the B labels if the attacker knows them; else recovered from the
        head's gradient (:func:`~attacks.inversion.labels.recover_labels`).
    bounds
        Lower and upper value of the inputs (broadcastable to ``input_shape``, e.g. per
        channel), if the server knows its input pipeline; every step is clipped to them.
    batch_size_method
        How ``batch_size`` was obtained, for the result.
    config
        Optimisation settings (default :class:`InversionConfig` ()).

    Returns
    -------
    list[Reconstruction]
        One per observation; ``inputs`` are B x prod(input_shape), ``status`` ``approximate``
        (an optimisation carries no certificate), ``confidence`` per sample the cosine
        similarity of the reconstruction's gradient with the observed one (clipped at 0).

    Raises
    ------
    AttackInputError
        For missing or misshapen gradients, NaN, bad labels or batch size.
    """
    config = config or InversionConfig()
    start = time.perf_counter()
    device = resolve_device(config.device)
    dtype = getattr(torch, config.dtype)
    if batch_size < 1:
        raise AttackInputError(f"batch_size={batch_size}: must be >= 1")
    if not gradients:
        raise AttackInputError("no gradient to invert")
    params = {k: _tensor(f"weight {k}", v, dtype, device) for k, v in weights.items()}
    targets = _checked_gradients(model, gradients, dtype, device)
    if labels is None:
        known = False
        label_rows = [recover_labels(head_signal(model, t), batch_size) for t in targets]
    else:
        known = True
        label_rows = [torch.as_tensor(list(row), dtype=torch.int64) for row in labels]
        if len(label_rows) != len(targets) or any(len(r) != batch_size for r in label_rows):
            raise AttackInputError(
                f"labels: need {len(targets)} rows of {batch_size} labels, one per observation"
            )
    trials = len(targets) * config.restarts
    y = torch.stack(label_rows).repeat_interleave(config.restarts, dim=0).to(device)
    target = {
        k: torch.stack([t[k] for t in targets]).repeat_interleave(config.restarts, dim=0)
        for k in targets[0]
    }
    gen = torch.Generator().manual_seed(config.seed)
    x = torch.randn(trials, batch_size, *input_shape, generator=gen, dtype=dtype).to(device)
    low, high = (None, None)
    if bounds is not None:
        low, high = (_tensor("bounds", b, dtype, device) for b in bounds)
        x = torch.maximum(torch.minimum(x, high), low)
    loss = config.loss

    def gradient_of(xb: torch.Tensor, yb: torch.Tensor) -> Params:
        def ce(p: Params) -> torch.Tensor:
            return nn.functional.cross_entropy(functional_call(model, p, (xb,)), yb)

        out: Params = grad(ce)(params)
        return out

    def objective(xb: torch.Tensor, yb: torch.Tensor, tb: Params) -> torch.Tensor:
        matched = gradient_distance(gradient_of(xb, yb), tb, loss)
        return matched + config.tv * total_variation(xb) if config.tv else matched

    step_direction = vmap(grad(objective))
    x.requires_grad_(True)
    optimiser = torch.optim.Adam([x], lr=config.lr)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(
        optimiser, [round(f * config.iterations) for f in _MILESTONES], gamma=0.1
    )
    for _ in range(config.iterations):
        direction = step_direction(x.detach(), y, target)
        x.grad = direction.sign() if config.signed else direction
        optimiser.step()
        scheduler.step()
        if low is not None and high is not None:
            with torch.no_grad():
                x.copy_(torch.maximum(torch.minimum(x, high), low))
    optimised = time.perf_counter() - start
    final = x.detach()
    with torch.no_grad():
        matched = vmap(lambda xb, yb, tb: gradient_distance(gradient_of(xb, yb), tb, loss))(
            final, y, target
        )
        cosine = vmap(lambda xb, yb, tb: 1 - gradient_distance(gradient_of(xb, yb), tb, "cosine"))(
            final, y, target
        )
    results = []
    settings = {
        **config.as_dict(),
        "device": str(device),
        "labels": "known" if known else "recovered",
    }
    for i in range(len(targets)):
        rows = slice(i * config.restarts, (i + 1) * config.restarts)
        best = i * config.restarts + int(torch.argmin(matched[rows]))
        similarity = float(cosine[best].clamp(0.0, 1.0))
        results.append(
            Reconstruction(
                inputs=final[best].flatten(1).to(device="cpu", dtype=torch.float64),
                batch_size=batch_size,
                batch_size_method=batch_size_method,
                status="approximate",
                confidence=torch.full((batch_size,), similarity, dtype=torch.float64),
                verified=torch.zeros(batch_size, dtype=torch.bool),
                certified=torch.zeros(batch_size, dtype=torch.bool),
                timings={"optimise": optimised, "total": time.perf_counter() - start},
                counts={
                    "restarts": config.restarts,
                    "iterations": config.iterations,
                    "trials": trials,
                },
                settings={
                    **settings,
                    "label_values": label_rows[i].tolist(),
                    "gradient_distance": float(matched[best]),
                },
            )
        )
    log.debug(
        "inverted %d observations x %d restarts in %.1f s",
        len(targets),
        config.restarts,
        time.perf_counter() - start,
    )
    return results
