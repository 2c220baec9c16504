"""Ctrl-C's way from the main thread to the ServerApp's.

In Flower's simulation the ServerApp runs in a thread of its own while the main thread runs
the clients; Ctrl-C raises KeyboardInterrupt in the main thread only, and the clients stop,
but the server thread would go on waiting for their replies (an hour by default) and keep
the process alive. The main thread therefore :meth:`Interruption.request`\\ s a stop; the
server's grid (:class:`InterruptibleGrid`) raises :class:`RunInterruptedError` at its next wait,
the server files what is pending and says it is :meth:`Interruption.done`, and the main
thread writes the report from what was recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run

# How often a waiting server looks for its replies and for a stop (Flower's own interval).
PULL_INTERVAL_S = 0.1


class RunInterruptedError(Exception):
    """Raised in the server thread when the run was asked to stop."""


class Interruption:
    """A stop request from the main thread, and the server thread's word that it stopped."""

    def __init__(self) -> None:
        self._requested = threading.Event()
        self._begun = threading.Event()
        self._done = threading.Event()

    @property
    def requested(self) -> bool:
        """Whether a stop was requested."""
        return self._requested.is_set()

    def request(self) -> None:
        """Ask the server to stop at its next wait on the grid."""
        self._requested.set()

    def check(self) -> None:
        """Raise :class:`RunInterruptedError` once a stop was requested.

        Raises
        ------
        RunInterruptedError
            When :meth:`request` was called.
        """
        if self._requested.is_set():
            raise RunInterruptedError("the run was interrupted")

    def begin(self) -> None:
        """Say that the server has started: from now on a stop waits for :meth:`done`."""
        self._begun.set()

    def done(self) -> None:
        """Say that the server has stopped (after filing what was pending)."""
        self._done.set()

    def wait_done(self, timeout_s: float) -> bool:
        """Wait for :meth:`done`, ``timeout_s`` at most, if the server began (one that has not
        stops at its first call on the grid); whether it is done or never began."""
        return not self._begun.is_set() or self._done.wait(timeout_s)


class InterruptibleGrid(Grid):
    """``grid``, whose waits end with :class:`RunInterruptedError` once a stop was requested.

    Every method delegates; :meth:`send_and_receive` pulls the replies itself, as Flower's
    grids do, checking for a stop between pulls.
    """

    def __init__(self, grid: Grid, interruption: Interruption) -> None:
        self.grid = grid
        self.interruption = interruption

    def set_run(self, run: Run) -> None:
        """Delegate."""
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        """Delegate."""
        return self.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Delegate."""
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Delegate, after checking for a stop (strategies poll this while waiting for nodes)."""
        self.interruption.check()
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Delegate, after checking for a stop."""
        self.interruption.check()
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Delegate."""
        return self.grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages`` and pull their replies until all came, ``timeout`` passed or a
        stop was requested.

        Raises
        ------
        RunInterruptedError
            When a stop was requested before every reply came.
        """
        pending = set(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending and (deadline is None or time.monotonic() < deadline):
            got = list(self.pull_messages(pending))
            replies += got
            pending -= {m.metadata.reply_to_message_id for m in got}
            if pending:
                self.interruption.check()
                time.sleep(PULL_INTERVAL_S)
        return replies
