"""What ``fl-sim run`` shows while a run goes: the rounds done, the global model's test
accuracy, the audit's attacks done of those queued, and the time since the start."""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn

from fl_sim.rundir import AGGREGATE_VIEW, AUDIT, PROXIES, REFUSED
from fl_sim.terminal import CONSOLE


def is_attack_outcome(record: dict[str, Any]) -> bool:
    """Whether an audit record is what came of a queued attack (judged, failed, timed out or
    interrupted), not an update never attacked (left out, rejected: no attack; refused), nor
    a secure aggregate's member, whose share of the one attack on the sum the sum's own record
    (``view: cohort``) counts."""
    return (
        record.get("attack") is not None
        and record.get("status") != REFUSED
        and record.get("view") != AGGREGATE_VIEW
    )


def is_proxies_outcome(row: dict[str, Any]) -> bool:
    """Whether a row of ``proxies.jsonl`` is what came of a queued proxies job."""
    return row.get("status") != REFUSED


# What each record file counts as done.
OUTCOMES = {AUDIT: is_attack_outcome, PROXIES: is_proxies_outcome}


class RunProgress:
    """The run's progress, fed by the server (rounds, attacks queued) and by the audit's files
    (attacks done).

    On a terminal a live line (rich) redrawn four times a second, with log records and prints
    shown above it; elsewhere (a file, a pipe, a CI log, pytest's capture) one plain line per
    round and one when the run ends. Thread-safe: the server reports from its own thread.

    Parameters
    ----------
    rounds
        The rounds the scenario asks for.
    run_dir
        Where the audit's records grow.
    live
        Redraw one line (default: when the console is a terminal).
    console
        Where it goes (default: the terminal's stderr, shared with the log).
    """

    def __init__(
        self,
        rounds: int,
        run_dir: Path,
        live: bool | None = None,
        console: Console = CONSOLE,
    ) -> None:
        self.rounds = rounds
        self.run_dir = run_dir
        self.console = console
        self.live = console.is_terminal if live is None else live
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._queued = 0
        self._done = 0
        self._read: dict[str, int] = {}  # bytes of each record file already counted
        self._last = ""  # the latest round's test metrics
        self._bar = Progress(
            TextColumn("round {task.completed:.0f}/{task.total:.0f}"),
            BarColumn(bar_width=30),
            TextColumn("{task.fields[model]}"),
            TextColumn("{task.fields[audit]}"),
            TextColumn("{task.fields[elapsed]}"),
            console=console,
            auto_refresh=False,  # drawn by this object's Live, which also polls the audit
        )
        self._task = self._bar.add_task("", total=rounds, model="", audit="", elapsed="")
        self._display: Live | None = None

    def __enter__(self) -> RunProgress:
        if self.live:
            self._display = Live(
                console=self.console,
                refresh_per_second=4,
                get_renderable=self._render,
                # Prints to a stdout of its own (fl-sim run > FILE) stay there.
                redirect_stdout=sys.stdout.isatty(),
            )
            self._display.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._display is not None:
            self._display.stop()  # drawn once more, then left on screen above the summary
            self._display = None
        elif self._queued or self._count_done():
            self._print(f"{self._audit()}, {self._elapsed()} in all")

    def note(self, text: str) -> None:
        """A line above the progress (the run's set-up: data, clients, rounds)."""
        self._print(text)

    def round_done(self, server_round: int, accuracy: float, loss: float, left_out: int) -> None:
        """The global model of ``server_round`` was tested (round 0: before training);
        ``left_out``: replies of the round the server did not aggregate."""
        with self._lock:
            self._last = f"test acc {accuracy:.3f}  loss {loss:.3f}" + (
                f"  {left_out} left out" if left_out else ""
            )
            self._bar.update(self._task, completed=server_round)
        if not self.live:
            label = f"round {server_round}/{self.rounds}" if server_round else "before training"
            audit = self._audit()
            self._print(f"{label}  {self._last}  {audit + '  ' if audit else ''}{self._elapsed()}")

    def round_trained(self, server_round: int, metrics: str = "") -> None:
        """``server_round`` was aggregated (for a federation whose server tests no model: a
        Flower app of one's own), with ``metrics`` to show, e.g. the clients' training loss."""
        with self._lock:
            self._last = metrics
            self._bar.update(self._task, completed=server_round)
        if not self.live:
            audit = self._audit()
            self._print(
                f"round {server_round}/{self.rounds}  {metrics + '  ' if metrics else ''}"
                f"{audit + '  ' if audit else ''}{self._elapsed()}"
            )

    def waiting(self, seconds_left: float) -> None:
        """The rounds are over and the audit waits for its last attacks, ``seconds_left`` at
        most (``wait_s``) before recording the rest as timed out."""
        left = str(timedelta(seconds=int(seconds_left)))
        with self._lock:
            self._last = f"waiting for the audit ({left} left of wait_s)"
        if not self.live:
            self._print(f"{self._audit()}, up to {left} left of wait_s  {self._elapsed()}")

    def attacks_queued(self, count: int) -> None:
        """The audit queued ``count`` more jobs (attacks and proxies)."""
        with self._lock:
            self._queued += count

    def _print(self, text: str) -> None:
        if self.live:
            self.console.print(text, highlight=False, markup=False)
        else:  # plain, never wrapped, whatever the console thinks the width is
            print(text, file=self.console.file, flush=True)

    def _render(self) -> RenderableType:
        audit = self._audit()
        with self._lock:
            self._bar.update(self._task, model=self._last, audit=audit, elapsed=self._elapsed())
            return self._bar.get_renderable()

    def _audit(self) -> str:
        """``audit D/Q attacks done`` ('' before anything was queued)."""
        done = self._count_done()
        with self._lock:
            queued = self._queued
        if not (done or queued):
            return ""  # before the first replies, or with the audit off
        # Under SecAgg+ the sums' attacks are queued where the server sees them, uncounted.
        return f"audit {done}/{queued} attacks done" if queued else f"audit {done} attacks done"

    def _elapsed(self) -> str:
        return str(timedelta(seconds=int(time.monotonic() - self.started)))

    def _count_done(self) -> int:
        """The audit's outcomes on file, reading only what was appended since the last call
        (a line still being written waits for its newline)."""
        with self._lock:
            for name, is_outcome in OUTCOMES.items():
                path = self.run_dir / name
                if not path.is_file():
                    continue
                with path.open("rb") as f:
                    f.seek(self._read.get(name, 0))
                    chunk = f.read()
                complete = chunk[: chunk.rfind(b"\n") + 1]
                self._read[name] = self._read.get(name, 0) + len(complete)
                self._done += sum(
                    is_outcome(json.loads(line)) for line in complete.splitlines() if line
                )
            return self._done
