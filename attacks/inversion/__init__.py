"""Optimisation-based gradient inversion ("Inverting Gradients" family): find inputs whose
gradient matches the observed one under an L2 or cosine distance, with a total-variation prior,
Adam and restarts; labels known or recovered from the head's gradient.

Unlike SPEAR++ it needs the whole model's update and its architecture, and it never certifies
a result: its reconstructions are approximate.
"""

from attacks.inversion.config import LOSSES, InversionConfig, InversionSettings
from attacks.inversion.engine import invert_gradients
from attacks.inversion.labels import head_signal, recover_labels

__all__ = [
    "LOSSES",
    "InversionConfig",
    "InversionSettings",
    "head_signal",
    "invert_gradients",
    "recover_labels",
]
