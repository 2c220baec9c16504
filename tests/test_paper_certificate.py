"""The paper's method takes the optimiser's points as they are (refine = "none"): its filter
is no certificate, so the attack vouches for no sample by its column, whatever the PSNR."""

from __future__ import annotations

import pytest

from attacks import paper_config, reconstruct
from tests.helpers import best_match_error, observation


@pytest.mark.parametrize("seed", [0, 1])
def test_the_papers_filter_certifies_no_column(seed: int) -> None:
    view, x, _ = observation(12, 100, seed)
    config = paper_config().replace(starts=300, steps=300, seed=seed)
    rec = reconstruct(**view, config=config)
    assert rec.status != "exact" and "which is no certificate" in rec.reason
    # Only samples a neuron isolates may be certified, and those are exact.
    if bool(rec.certified.any()):
        assert best_match_error(rec.inputs[rec.certified], x).max() < 1e-6
