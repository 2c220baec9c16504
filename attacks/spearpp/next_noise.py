"""How much the next layer's equations weigh in the scale fit: the two layers' noise levels.

The joint fit of the column scales (:func:`attacks.spearpp.solve.next_layer_scales`) takes
this layer's bias-gradient equations and the next layer's together. DP-SGD adds noise of one
level to every entry, and then equal weights are right. A float32 update delivered as a
float64 difference (w_sent - w_after) carries round-off proportional to each layer's own
weights instead: measured on m=200 networks trained 300 SGD steps, the next layer's per-entry
noise is 3.7 times this layer's (its weights are sqrt(3072 / 200) times larger), and equal
weights lowered the exact share from 87% to 79% of samples. Each layer's equations are
therefore weighted by the inverse of its own noise, the next layer's read off its gradient.
"""

from __future__ import annotations

import math

import torch

from attacks.spearpp.hidden import row_space_sketch
from attacks.spearpp.inputs import NextLayer

# Power iterations of the sketch: noise fills the mixes' range otherwise.
_POWER_ITERATIONS = 2


def next_layer_noise(next_layer: NextLayer, batch_size: int) -> float:
    """Per-entry noise std of the next layer's weight gradient off its rank-B part.

    The gradient's energy outside its top B directions, over the (k - B)(m - B) entries it
    spreads over (k x m the gradient's shape), the directions sketched
    (:func:`attacks.spearpp.hidden.row_space_sketch`; a full SVD at m=4000 costs tens of
    seconds). 0 where the gradient has no more than B dimensions either way.
    """
    grad = next_layer.grad_weight
    rows, cols = grad.shape
    if min(rows, cols) <= batch_size:
        return 0.0
    sketch = row_space_sketch(grad, batch_size, _POWER_ITERATIONS)
    right = torch.linalg.svd(grad @ sketch, full_matrices=False)[2][:batch_size]
    top = sketch @ right.T  # cols x B: the top B directions
    # The residual itself, not the energies' difference, which cancels to float64's
    # round-off of the whole (1e-8 of the norm once the square root is taken).
    outside = float((grad - (grad @ top) @ top.T).square().sum())
    return math.sqrt(outside / ((rows - batch_size) * (cols - batch_size)))


def next_layer_weight(next_layer: NextLayer, batch_size: int, noise_std: float) -> float:
    """The next layer's equations' weight against this layer's, whose noise is ``noise_std``
    per entry: the ratio of the two noise levels (1 where the next layer's gradient has no
    dimension beyond B to read its noise from)."""
    other = next_layer_noise(next_layer, batch_size)
    return noise_std / other if other > 0 and noise_std > 0 else 1.0
