"""Labels from the classification head's gradient, for an attacker who is not told them.

With cross-entropy, the head's bias gradient is the batch mean of (softmax - one-hot): for one
sample its only negative entry is the label; for a batch, classes present push their entries
down by about one per sample (Wainakh et al.'s count heuristic, sketched in the function).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from attacks.errors import AttackInputError


def head_signal(model: nn.Module, gradient: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Per class, the head's gradient signal: its bias gradient, or without a bias its weight
    gradient's row sums (after ReLU the head's inputs are >= 0, so the signs agree).

    Raises
    ------
    AttackInputError
        If the model has no linear layer or its gradient is missing.
    """
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise AttackInputError("the model has no nn.Linear head to read labels from")
    head = linears[-1]
    for key, reduce in ((f"{head}.bias", False), (f"{head}.weight", True)):
        if key in gradient:
            g = gradient[key]
            return g.sum(dim=1) if reduce else g
    raise AttackInputError(f"the gradient holds neither {head}.bias nor {head}.weight")


def recover_labels(signal: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Labels of a batch (sorted) from the head's per-class gradient signal.

    Batch of one: the class of the most negative entry (the only negative one for an exact
    gradient). Larger batches: every class with a negative entry is present, the most negative
    first; each assignment adds back one sample's share of the negative mass (the total of the
    negative entries over B), and the remaining slots go, one at a time, to the class whose
    entry is still the most negative.
    """
    if batch_size < 1:
        raise AttackInputError(f"batch_size={batch_size}: must be >= 1")
    g = signal.detach().to(torch.float64).cpu().clone()
    if batch_size == 1:
        return torch.argmin(g).reshape(1)
    negative = torch.nonzero(g < 0).flatten()
    labels = negative[torch.argsort(g[negative])][:batch_size].tolist()
    share = float(g[g < 0].sum()) / batch_size if len(negative) else -1.0
    for c in labels:
        g[c] -= share
    while len(labels) < batch_size:
        c = int(torch.argmin(g))
        labels.append(c)
        g[c] -= share
    return torch.tensor(sorted(labels), dtype=torch.int64)
