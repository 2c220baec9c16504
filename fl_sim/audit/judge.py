"""The judge: where ground truth (which samples a client trained on) enters the audit, and only
after an attack returned (or, for the proxies and ``knows_labels``, when the judge hands the
truth on): it matches reconstructions to the true samples (Hungarian), scores them on the
data's [0, 1] scale, and attributes what came back of a SecAgg+ sum to each summed client.

The input shape and the normalisation to undo come from the data's own description
(:class:`~fl_sim.data.description.DataDescription`): images, tabular records or any other
shape alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from clients.reply import SAMPLE_IDS
from fl_sim.audit.job import AttackOutcome
from fl_sim.audit.metrics import BatchQuality, match_and_score
from fl_sim.data.federated import FederatedData


def sample_ids(audit: Mapping[str, Any]) -> np.ndarray:
    """The ids of the samples a client trained on, from its reply's ``audit`` record (none
    where it sent none: a Flower app of one's own, a SecAgg+ client)."""
    return np.asarray(audit.get(SAMPLE_IDS, []), dtype=np.int64)


def true_batch_size(audit: Mapping[str, Any]) -> int | None:
    """The client's true batch size, ``None`` where it sent no sample ids."""
    return len(audit[SAMPLE_IDS]) if SAMPLE_IDS in audit else None


@dataclass(frozen=True)
class Verdict:
    """The judge's figures on one batch of true samples, and what its grid shows.

    Attributes
    ----------
    fields
        The record's metrics: PSNR, SSIM, the shares exact and near-exact, per sample its id,
        label, PSNR and MSE (and, for a client's own batch, the share the attack certified).
    truth
        The true samples on the [0, 1] scale (B x sample shape).
    matched
        Each true sample's matched reconstruction, zeros where none was matched.
    """

    fields: Mapping[str, Any]
    truth: np.ndarray
    matched: np.ndarray


class Judge:
    """Scores reconstructions against the run's data.

    Parameters
    ----------
    data
        The run's data: the records, their labels and their description.
    draws
        (client, round) -> the ids of the samples the client trained on, for clients that send
        none (under SecAgg+): the simulation's own draw.
    """

    def __init__(
        self, data: FederatedData, draws: Callable[[int, int], np.ndarray] | None = None
    ) -> None:
        self.data = data
        self.draws = draws

    @property
    def is_image(self) -> bool:
        """Whether the samples are C x H x W images (their grids are images, else heat-maps)."""
        return self.data.description.is_image

    def drawn(self, client: int, server_round: int) -> np.ndarray:
        """The ids of the samples ``client`` drew in ``server_round`` (none without draws)."""
        ids = self.draws(client, server_round) if self.draws is not None else np.empty(0)
        return np.asarray(ids, dtype=np.int64)

    def labels(self, ids: np.ndarray) -> tuple[int, ...]:
        """The true labels of ``ids``, for an attack told them (``knows_labels``)."""
        return tuple(int(v) for v in self.data.labels[ids])

    def inputs(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The samples ``ids`` as the model takes them (float64) and their labels: the
        proxies are computed at the truth."""
        inputs, labels = self.data.tensors(ids)
        return inputs.double().numpy(), labels.numpy()

    def judge(self, out: AttackOutcome, ids: np.ndarray) -> Verdict:
        """A client's batch ``ids`` against what the attack on its update recovered."""
        rec, truth, quality = self._score(out, ids)
        fields = self._fields(quality, ids)
        fields["share_certified"] = out.summary["certified"] / max(len(ids), 1)
        return Verdict(fields, truth.numpy(), _matched(truth, rec, quality))

    def judge_cohort(
        self, out: AttackOutcome, members: list[np.ndarray]
    ) -> tuple[Verdict, list[Verdict]]:
        """The attack on a sum against the union of every summed client's batch (the cohort's
        verdict), and each client's share of it: every recovered sample goes to the client
        whose sample it was matched to."""
        ids = np.concatenate(members) if members else np.empty(0, np.int64)
        rec, truth, quality = self._score(out, ids)
        per_client = []
        start = 0
        for own in members:
            part = slice(start, start + len(own))
            start += len(own)
            share = BatchQuality(
                match=quality.match[part],
                psnr=quality.psnr[part],
                mse=quality.mse[part],
                ssim=None if quality.ssim is None else quality.ssim[part],
            )
            per_client.append(
                Verdict(
                    self._fields(share, own), truth[part].numpy(), _matched(truth[part], rec, share)
                )
            )
        fields = self._fields(quality, ids)
        # Of the sum's samples: the attack certifies samples of the sum, not of a client.
        fields["share_certified"] = out.summary["certified"] / max(len(ids), 1)
        return Verdict(fields, truth.numpy(), _matched(truth, rec, quality)), per_client

    def _score(
        self, out: AttackOutcome, ids: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, BatchQuality]:
        """The reconstruction and the truth on the data's [0, 1] scale, matched and scored."""
        described = self.data.description
        truth = self.data.unit(ids)
        if out.inputs is None:
            raise ValueError("the attack returned no reconstruction")
        rec = described.normalization.undo(
            torch.from_numpy(out.inputs).reshape(-1, *described.input_shape)
        )
        return rec, truth, match_and_score(rec, truth)

    def _fields(self, quality: BatchQuality, ids: np.ndarray) -> dict[str, Any]:
        """The judge's figures over the true samples ``ids``, and each sample's."""
        labels = self.data.labels
        return {
            **{k: v for k, v in quality.summary().items() if k != "samples"},
            "samples": [
                {"id": int(i), "label": int(labels[i]), "psnr": float(p), "mse": float(m)}
                for i, p, m in zip(ids, quality.psnr, quality.mse, strict=True)
            ],
        }


def _matched(truth: torch.Tensor, rec: torch.Tensor, quality: BatchQuality) -> np.ndarray:
    """Each true sample's matched reconstruction (zeros where it got none)."""
    matched = np.zeros_like(truth.numpy())
    ok = quality.match >= 0
    matched[ok] = rec.numpy()[quality.match[ok]]
    return matched
