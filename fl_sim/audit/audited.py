"""The drop-in audit of a user's own Flower ServerApp: any strategy wrapped with the
honest-but-curious server, its records written to a run directory, no ground truth needed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from attacks import ATTACKS
from fl_sim.audit.auditor import Auditor, counted
from fl_sim.audit.context import AuditContext
from fl_sim.config.schema import AuditSpec
from fl_sim.data.normalize import Normalization
from fl_sim.model import array_keys, first_linear
from fl_sim.progress import RunProgress
from fl_sim.report import build_report
from fl_sim.report.terminal import print_summary
from strategies import HonestButCurious, InterceptedUpdate


class AuditError(ValueError):
    """The model cannot be audited as given; the message names what was found."""


def find_layer(
    arrays: ArrayRecord, layer: str | None = None, model: nn.Module | None = None
) -> tuple[str, str]:
    """The ArrayRecord keys (weight, bias) of the layer to attack.

    Parameters
    ----------
    arrays
        The global model's arrays as the server sends them.
    layer
        The layer's name (``fc1`` for ``fc1.weight``, ``fc1.bias``), if the user names it.
    model
        The model: the layer is found by what its ``forward`` computes, or ``layer`` checked
        against it (:func:`fl_sim.model.first_linear`). Without it (and without ``layer``) the
        first array must be a linear layer's weight, which is then assumed to be followed by
        ReLU.

    Raises
    ------
    AuditError
        Naming the arrays (keys and shapes) or the module found instead of a linear layer
        followed by ReLU.
    """
    found = ", ".join(f"{k} {tuple(arrays[k].shape)}" for k in list(arrays)[:6])
    if model is not None:
        try:
            layer = first_linear(model, layer)[0]
        except ValueError as err:
            raise AuditError(f"model: {err}") from None
    if layer is None:
        if not arrays:
            raise AuditError("the global model has no arrays")
        first = next(iter(arrays))
        if not first.endswith(".weight") or len(arrays[first].shape) != 2:
            raise AuditError(
                f"the first array is {first} {tuple(arrays[first].shape)}, not a linear layer's "
                f"(m, n) weight (arrays: {found}, ...): SPEAR++ attacks a first Linear followed "
                "by ReLU; name it with layer=..., or pass model=..."
            )
        layer = first.removesuffix(".weight")
    w_key, b_key = array_keys(layer)
    weight = arrays.get(w_key)
    bias = arrays.get(b_key)
    if weight is None or bias is None:
        raise AuditError(f"layer={layer!r}: no arrays {w_key}, {b_key} (arrays: {found}, ...)")
    if len(weight.shape) != 2 or tuple(bias.shape) != (weight.shape[0],):
        raise AuditError(
            f"layer={layer!r}: {w_key} {tuple(weight.shape)} and {b_key} {tuple(bias.shape)} are "
            "not a linear layer's (m, n) weight and (m,) bias"
        )
    return w_key, b_key


class AuditedStrategy(HonestButCurious):
    """``strategy`` as it is, audited: SPEAR++ on every client's update of the first linear
    layer, beside the federation; records in ``run_dir/audit.jsonl``.

    A drop-in for a ServerApp's strategy: ``AuditedStrategy(FedAvg(...), "runs/app").start(
    grid=grid, initial_arrays=arrays, num_rounds=3)``. :meth:`start` finds the layer in the
    initial arrays (refusing at once a model it cannot attack), runs the rounds with a progress
    line each (the audit's attacks done of those queued), then waits for the attacks still
    running (saying how long is left of ``wait_s``), writes ``report.html`` and prints the
    audit's tables, as ``fl-sim run`` does; ``audited.json`` keeps what the audit
    was run with, for ``fl-sim audit`` to resume it. With no ground truth each record
    holds what the attack knows: status, estimated batch size, certified (exact) samples,
    timings, the reconstruction (``reconstructions/``) and, for images, its grid (``grids/``).

    Parameters
    ----------
    strategy
        Any ``flwr.serverapp.strategy`` strategy.
    run_dir
        Where the records go (created).
    layer
        The attacked layer's name (default: found, see :func:`find_layer`).
    model
        The model, whose ``forward`` tells which layer the input reaches first and that ReLU
        follows it (with ``layer`` too: that layer is checked).
    input_shape
        One input's shape before flattening, e.g. ``(1, 8, 8)``: C x H x W inputs get grids.
    mean, std
        The per-channel normalisation of the inputs, undone in the grids.
    settings
        The audit's budget and knowledge (``AuditSpec``; only SPEAR++, no proxies).
    seed
        Seeds the attacks.
    """

    def __init__(
        self,
        strategy: Strategy,
        run_dir: str | Path,
        *,
        layer: str | None = None,
        model: nn.Module | None = None,
        input_shape: tuple[int, ...] | None = None,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        settings: AuditSpec | None = None,
        seed: int = 0,
    ) -> None:
        if (mean is None) != (std is None):
            raise AuditError("mean and std go together: give both or neither")
        if mean is not None and input_shape is None:
            raise AuditError("mean and std need input_shape, to know the channels they apply to")
        self.run_dir = Path(run_dir)
        self.spec = settings or AuditSpec()
        if self.spec.proxies or not all(ATTACKS[a].runs_without_truth for a in self.spec.attacks):
            raise AuditError(
                f"settings.attacks={list(self.spec.attacks)}, settings.proxies="
                f"{self.spec.proxies}: without ground truth only attacks that certify what they "
                f"report run ({', '.join(n for n, a in ATTACKS.items() if a.runs_without_truth)})"
                ", without proxies"
            )
        self.named_layer = layer
        self.model = model
        self.input_shape = input_shape
        self.normalization = (
            Normalization(mean, std, len(input_shape or ()))
            if mean is not None and std is not None
            else None
        )
        self.seed = seed
        self.auditor: Auditor | None = None
        self.progress: RunProgress | None = None
        # The layer and the sink are known once start() has seen the initial arrays.
        super().__init__(strategy, _before_start, ("", ""))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Intercept and aggregate as the wrapped strategy would; then a progress line."""
        arrays, metrics = super().aggregate_train(server_round, replies)
        if self.progress is not None:
            shown = "  ".join(
                f"{k} {v:.3f}" for k, v in (metrics or {}).items() if isinstance(v, float)
            )
            self.progress.round_trained(server_round, shown)
        return arrays, metrics

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Find the attacked layer, run the federation as the wrapped strategy would, then
        wait for the audit's attacks (``settings.wait_s`` at most) and write the report.

        Raises
        ------
        AuditError
            Before any round, when the model has no linear layer followed by ReLU to attack.
        """
        self.layer = find_layer(initial_arrays, self.named_layer, self.model)
        # Plain lines: under flwr run the ServerApp's output reaches the user through its log.
        self.progress = RunProgress(num_rounds, self.run_dir, live=False)
        self.auditor = Auditor(
            AuditContext.for_app(
                self.spec,
                self.run_dir,
                self.seed,
                self.model,
                self.layer,
                self.input_shape,
                self.normalization,
            )
        )
        self.sink = counted(self.auditor, self.progress)
        try:
            with self.progress:  # its last line once the audit is done
                try:
                    return super().start(
                        grid,
                        initial_arrays,
                        num_rounds,
                        timeout,
                        train_config,
                        evaluate_config,
                        evaluate_fn,
                    )
                finally:
                    self.auditor.finish(waiting=self.progress.waiting)
        finally:
            build_report(self.run_dir)
            print_summary(self.run_dir)


def _before_start(update: InterceptedUpdate) -> None:
    """No reply reaches the sink before :meth:`AuditedStrategy.start` sets the real one."""
    raise RuntimeError("AuditedStrategy intercepted a reply before start()")
