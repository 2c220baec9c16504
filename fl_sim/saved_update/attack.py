"""SPEAR++ on a saved update, without ground truth: what the attack recovers and vouches for."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from attacks import Reconstruction, SpearConfig, reconstruct
from fl_sim.audit.grid import DRAWABLE_CHANNELS, save_row
from fl_sim.rundir import ATTACK_GRID, ATTACK_RECONSTRUCTION, ATTACK_RESULT
from fl_sim.saved_update.update_file import SavedUpdate


def attack_update(
    update: SavedUpdate, out: Path, config: SpearConfig | None = None
) -> dict[str, Any]:
    """Reconstruct the batch behind ``update`` and write what was found to ``out``.

    Writes ``reconstruction.npz`` (``inputs``: B_hat x n in the layer's input space,
    ``certified``: B_hat booleans, the samples the attack vouches for), ``result.json`` (the
    returned result) and, for C x H x W inputs of 1 or 3 channels, ``grid.png``.

    Parameters
    ----------
    update
        The checked update.
    out
        The output folder (created).
    config
        SPEAR++'s settings (default :class:`SpearConfig` ()).

    Returns
    -------
    dict
        ``status``, ``batch_size_estimated``, ``certified``, ``timings`` (seconds), ``inferred``
        (the noise floor, the noise estimated from the spectrum, undeclared noise, how the batch
        size was found and how clearly), ``given`` (what the file told the attack) and
        ``attack`` (the attack's full summary).
    """
    floor = update.noise_floor
    start = time.perf_counter()
    rec = reconstruct(
        update.grad_weight,
        update.grad_bias,
        update.weight,
        update.bias,
        batch_size=update.batch_size,
        noise_std=floor or None,
        next_layer=update.next_layer,
        config=config,
    )
    attack_s = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    inputs = rec.inputs.numpy()
    certified = rec.certified.numpy().astype(bool)
    np.savez(out / ATTACK_RECONSTRUCTION, inputs=inputs, certified=certified)
    grid, why = _grid(update, inputs, out / ATTACK_GRID)
    result = {
        "status": rec.status,
        "reason": rec.reason,
        "batch_size_estimated": rec.batch_size,
        "certified": int(certified.sum()),
        "timings": {"attack_s": attack_s, **rec.timings},
        "inferred": _inferred(update, rec),
        "given": {
            "gradient": update.gradient_from,
            "layer": [update.width, update.input_dim],
            "batch_size": update.batch_size,
            "noise_std": update.noise_std,
            "steps": update.steps,
            "next_layer": update.next_layer is not None,
            "next_weight": update.next_layer is not None and len(update.next_layer) == 3,
            "input_shape": list(update.input_shape) if update.input_shape else None,
        },
        "files": {"reconstruction": ATTACK_RECONSTRUCTION, "grid": grid, "grid_note": why},
        "attack": rec.summary(),
    }
    (out / ATTACK_RESULT).write_text(json.dumps(result, indent=2) + "\n")
    return result


def _inferred(update: SavedUpdate, rec: Reconstruction) -> dict[str, Any]:
    return {
        "noise_floor": update.noise_floor,
        "rounding_noise": update.rounding_noise,
        "noise_std_estimated": rec.noise_std_estimated,
        "noise_std_used": rec.noise_std_used,
        "undeclared_noise": rec.undeclared_noise,
        "noise_note": rec.noise_note,
        "batch_size_method": rec.batch_size_method,
        "batch_size_confidence": rec.batch_size_confidence,
    }


def _grid(update: SavedUpdate, inputs: np.ndarray, path: Path) -> tuple[str | None, str]:
    """The reconstructions drawn as images when the input shape allows: the grid's file name
    (or None) and how its pixels were obtained (or why there is none)."""
    shape = update.input_shape
    if shape is None:
        return None, "no grid: the file has no input_shape"
    if len(shape) != 3 or shape[0] not in DRAWABLE_CHANNELS:
        return None, f"no grid: input_shape {list(shape)} is no C x H x W image of 1 or 3 channels"
    images = inputs.reshape(-1, *shape)
    if update.mean is not None and update.std is not None:
        mean = np.asarray(update.mean).reshape(-1, 1, 1)
        std = np.asarray(update.std).reshape(-1, 1, 1)
        images = images * std + mean
        note = "pixels: inputs * std + mean"
    else:
        # Without the normalisation each image is stretched to [0, 1], to be seen at all.
        low = images.min(axis=(1, 2, 3), keepdims=True)
        span = np.maximum(images.max(axis=(1, 2, 3), keepdims=True) - low, 1e-12)
        images = (images - low) / span
        note = "pixels: each image stretched to [0, 1] (no mean, std in the file)"
    if len(images):
        save_row(images, path)
        return path.name, note
    return None, "no grid: nothing was reconstructed"
