"""The forecast: per-sample vulnerability proxies (gradient norm, LAVP) evaluated at the true
sample, and how well they rank what an attack actually recovered (Spearman).

This is the judge's side: the proxies need the ground truth x*, so nothing here is ever handed
to an attack.
"""

from fl_sim.forecast.eigen import Extremes, extreme_eigenvalues
from fl_sim.forecast.proxies import PROXIES, SampleProxies, sample_proxies
from fl_sim.forecast.spearman import spearman, spearman_interval

__all__ = [
    "PROXIES",
    "Extremes",
    "SampleProxies",
    "extreme_eigenvalues",
    "sample_proxies",
    "spearman",
    "spearman_interval",
]
