"""SPEAR++: exact reconstruction of a batch from a ReLU-followed linear layer's gradient."""

from attacks.spearpp.config import PRESETS, SpearConfig, paper_config
from attacks.spearpp.engine import run_spearpp

__all__ = ["PRESETS", "SpearConfig", "paper_config", "run_spearpp"]
