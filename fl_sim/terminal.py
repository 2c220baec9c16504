"""What ``fl-sim`` writes to the terminal: one log handler, the libraries' noise kept off it.

The root logger takes INFO and above (a run's ``run.log`` keeps it all); the terminal gets
warnings and errors (INFO with ``--verbose``), once each, without the notices of Flower, Ray's
state database and the simulation that a user of fl-sim cannot act on.
"""

from __future__ import annotations

import logging

from flwr.common.logger import FLOWER_LOGGER, console_handler
from rich.console import Console
from rich.logging import RichHandler

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"

# Flower's notices about choices fl-sim made on purpose, dropped from the terminal (run.log keeps
# them), each by the start of its message:
KNOWN_NOTICES = (
    # fl-sim evaluates the global model on the server (RunRecorder.evaluate), not on the clients.
    "fraction_evaluate is set to 0.0",
    # fl-sim run's legacy runtime, kept in fl_sim.apps.in_process: see docs/deployment.md
    # ("fl-sim run on flwr run").
    "DEPRECATED FEATURE: The `run_simulation` function is deprecated",
)
# Loggers whose INFO lines are set-up chatter: alembic migrates Flower's state database (one
# line per plugin at every start), Ray's and Flower's own progress is fl-sim's progress.
QUIET_LOGGERS = ("alembic", "flwr", "ray")
# Loggers whose warnings are no user's business: matplotlib warns once per font family a log
# axis' tick labels ask for when its font cache lacks them (a cache built by another install),
# and falls back to a font it has.
SILENT_LOGGERS = ("matplotlib.font_manager",)

# The terminal's stderr, shared by the log handler and the progress display so that neither
# writes across the other.
CONSOLE = Console(stderr=True)


def _not_a_known_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(KNOWN_NOTICES)


def configure_logging(terminal_level: int) -> logging.Handler:
    """Send log records to the terminal at ``terminal_level`` and above; returns its handler.

    On a terminal records go through :data:`CONSOLE`, which prints them above a live progress
    display instead of across it; elsewhere (a file, a pipe, a CI log) as plain lines to
    stderr.
    """
    handler: logging.Handler
    if CONSOLE.is_terminal:
        handler = RichHandler(console=CONSOLE, show_path=False, markup=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt=DATE_FORMAT))
    handler.setLevel(terminal_level)
    handler.addFilter(_not_a_known_notice)
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in SILENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # Flower prints its records itself (in colour, even into files) and passes them on to the
    # root logger too: every warning came twice. The root's handler alone shows them, once.
    FLOWER_LOGGER.removeHandler(console_handler)
    return handler
