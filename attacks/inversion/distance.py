"""Gradient distances the attack minimises, and its image prior."""

from __future__ import annotations

from collections.abc import Mapping

import torch

Params = Mapping[str, torch.Tensor]


def _dot(a: Params, b: Params) -> torch.Tensor:
    return torch.stack([(a[k] * b[k]).sum() for k in b]).sum()


def gradient_distance(g: Params, target: Params, loss: str) -> torch.Tensor:
    """``l2``: ``||g - target||^2``; ``cosine``: ``1 - cos(g, target)``, over all entries at
    once (keys of ``target``)."""
    if loss == "l2":
        return torch.stack([(g[k] - target[k]).square().sum() for k in target]).sum()
    norm = _dot(g, g).sqrt() * _dot(target, target).sqrt()
    return 1 - _dot(g, target) / norm.clamp_min(torch.finfo(norm.dtype).tiny)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of horizontally and vertically neighbouring pixels (..., H, W)."""
    dx = (x[..., :, 1:] - x[..., :, :-1]).abs().mean()
    dy = (x[..., 1:, :] - x[..., :-1, :]).abs().mean()
    return dx + dy
