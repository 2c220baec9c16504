"""Each point's rows under a mask, gathered: products over them cost what the masked rows do."""

from __future__ import annotations

import torch


def masked_rows(mask: torch.Tensor, *tables: torch.Tensor) -> list[torch.Tensor]:
    """For each mask (K x m boolean), its rows of each table (m x c): K x r x c, r the largest
    count, padded with zero rows (which add nothing to Gram matrices or products over rows)."""
    counts = mask.sum(dim=1)
    width = int(counts.max()) if counts.numel() else 0
    index = mask.to(torch.int8).argsort(dim=1, descending=True, stable=True)[:, :width]
    valid = (torch.arange(width, device=mask.device) < counts[:, None]).unsqueeze(-1)
    return [table[index] * valid for table in tables]
