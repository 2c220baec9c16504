"""``topk`` against a brute-force reference: exactly ceil(share x n) entries of the update kept,
the largest in magnitude, per tensor or over the whole model; its settings validated."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from flwr.app import ConfigRecord

from clients.defences.base import UPDATE_MODS
from clients.defences.topk import SCOPE, SHARE, TopK, TopKSettings, keep_largest
from clients.reply import CLIENT
from fl_sim.config import ConfigError, parse_scenario
from tests.test_defences import arrays_of, reply_through, update_of

pytestmark = pytest.mark.usefixtures("flower_identity")


def _reference(values: np.ndarray, share: float) -> np.ndarray:
    """Brute force: walk the entries from the largest magnitude down, keep the first k."""
    flat = values.reshape(-1)
    k = math.ceil(share * flat.size)
    order = sorted(range(flat.size), key=lambda i: (-abs(flat[i]), i))
    kept = np.zeros_like(flat)
    for i in order[:k]:
        kept[i] = flat[i]
    return kept.reshape(values.shape)


@pytest.mark.parametrize("share", [0.01, 0.1, 0.37, 1.0])
def test_keeps_exactly_the_k_largest_entries(share: float) -> None:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((13, 7))
    values[0, :3] = values[1, 0]  # ties: broken by position
    kept = keep_largest(values, share)
    assert np.count_nonzero(kept) == math.ceil(share * values.size)
    assert np.array_equal(kept, _reference(values, share))


@pytest.mark.parametrize("scope", ["tensor", "model"])
def test_the_mod_sends_only_the_kept_entries(scope: str) -> None:
    rng = np.random.default_rng(1)
    sent = arrays_of(rng)
    received = {k: v + rng.standard_normal(v.shape) for k, v in sent.items()}
    truth = {k: received[k] - sent[k] for k in sent}
    settings = TopKSettings(share=0.2, scope=scope)  # type: ignore[arg-type]
    update = update_of(reply_through(TopK().mod(settings, seed=0), sent, received), sent)
    if scope == "tensor":
        for key in sent:
            assert np.allclose(update[key], _reference(truth[key], 0.2), rtol=0, atol=1e-12)
    else:
        flat = np.concatenate([truth[k].reshape(-1) for k in sent])
        want = _reference(flat, 0.2)
        got = np.concatenate([update[k].reshape(-1) for k in sent])
        assert np.allclose(got, want, rtol=0, atol=1e-12)
    assert sum(np.count_nonzero(np.abs(u) > 1e-12) for u in update.values()) == (
        math.ceil(0.2 * 30) + math.ceil(0.2 * 6) if scope == "tensor" else math.ceil(0.2 * 36)
    )


def test_declares_its_share_and_discloses_no_noise() -> None:
    sent = arrays_of(np.random.default_rng(2))
    received = {k: v + 0.1 for k, v in sent.items()}
    reply = reply_through(TopK().mod(TopKSettings(share=0.5), seed=0), sent, received)
    record = reply.content[CLIENT]
    assert isinstance(record, ConfigRecord)
    assert (record[SHARE], record[SCOPE], record[UPDATE_MODS]) == (0.5, "tensor", ["topk"])
    assert not TopK().disclose(dict(record), None).adds_noise


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"share": 0}, "clients.0.topk.share = 0.0: must be > 0"),
        ({"share": 1.5}, "clients.0.topk.share = 1.5: must be <= 1"),
        ({"share": "10%"}, "clients.0.topk.share = '10%': expected float"),
        ({"scope": "layer"}, "clients.0.topk.scope = 'layer': allowed are tensor, model"),
        ({"k": 3}, "unknown key 'clients.0.topk.k': allowed are scope, share"),
    ],
)
def test_settings_are_validated_up_front(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_scenario({"clients": {"count": 1, "0": {"topk": table}}})
