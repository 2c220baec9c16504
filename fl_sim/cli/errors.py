"""How a command stops on bad input: one line naming the file or key and what is wrong, and
exit status 2, as argparse's own usage errors (a run that failed exits 1)."""

from __future__ import annotations

EXIT_BAD_INPUT = 2


class BadInput(SystemExit):
    """Bad input to a command: ``str()`` is the line to print, ``code`` is 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = EXIT_BAD_INPUT
