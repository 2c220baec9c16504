"""What a user sees on the terminal: the progress of a run, its summary, and none of the
libraries' set-up chatter; help without reStructuredText."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from fl_sim.cli import build_parser
from fl_sim.progress import RunProgress

ROOT = Path(__file__).resolve().parents[1]
# What fl-sim run printed before (Ray's state database, geoopt, Flower), none of it a user's.
NOISE = (
    "alembic",
    "torch.jit",
    "FutureWarning",
    "DEPRECATED FEATURE",
    "run_simulation",
    "fraction_evaluate",
    "Starting logstream",  # flwr run's own lines (fl-sim run's default runtime)
    "SuperLink",
    "\x1b[",  # colour codes, in a pipe
)
RST = ("``", ":class:", ":func:", ":meth:", ":mod:", ":data:", ":attr:")


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every sub-command's, recursively."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_no_help_shows_restructured_text() -> None:
    parsers = _parsers(build_parser())
    assert len(parsers) >= 13  # fl-sim, run, audit, report, attack, bench and its 7
    for parser in parsers:
        text = parser.format_help()
        assert not [m for m in RST if m in text], (parser.prog, text)


def test_the_known_warnings_alone_are_filtered() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("`torch.jit.script` is deprecated. Please switch", FutureWarning, 2)
        warnings.warn("Full backward hook is firing when gradients are computed", UserWarning, 2)
        warnings.warn("a warning of one's own", FutureWarning, 2)
    assert [str(w.message) for w in caught] == ["a warning of one's own"]


def _audit_line(path: Path, record: dict[str, object], end: str = "\n") -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + end)


def test_plain_progress_one_line_per_round(tmp_path: Path) -> None:
    out = io.StringIO()
    progress = RunProgress(2, tmp_path, console=Console(file=out, force_terminal=False))
    assert not progress.live
    with progress:
        progress.round_done(0, 0.1, 2.3, 0)
        progress.attacks_queued(3)
        audit = tmp_path / "audit.jsonl"
        _audit_line(audit, {"attack": "spearpp", "status": "exact"})
        _audit_line(audit, {"attack": None, "status": "diverged"})  # left out: never queued
        _audit_line(audit, {"attack": "spearpp", "status": "refused"})  # not queued either
        _audit_line(audit, {"attack": "spearpp", "view": "aggregate", "status": "partial"})
        _audit_line(audit, {"attack": "spearpp", "status": "partial"}, end="")  # half written
        progress.round_done(1, 0.25, 2.0, 1)
        with audit.open("a") as f:
            f.write("\n")
        _audit_line(tmp_path / "proxies.jsonl", {"status": "done"})
        progress.round_done(2, 0.3, 1.9, 0)
    lines = [re.sub(r"\d+:\d\d:\d\d", "T", line) for line in out.getvalue().splitlines()]
    assert lines == [
        "before training  test acc 0.100  loss 2.300  T",
        "round 1/2  test acc 0.250  loss 2.000  1 left out  audit 1/3 attacks done  T",
        "round 2/2  test acc 0.300  loss 1.900  audit 3/3 attacks done  T",
        "audit 3/3 attacks done, T in all",
    ]


def test_live_progress_on_a_terminal_leaves_the_summary_whole(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    progress = RunProgress(2, tmp_path, console=console)
    assert progress.live
    with progress:
        progress.note("tiny: 2 clients, 2 rounds")
        progress.attacks_queued(2)
        for r in (0, 1, 2):
            progress.round_done(r, 0.5, 1.0, 0)
        _audit_line(tmp_path / "audit.jsonl", {"attack": "spearpp", "status": "exact"})
        print("printed while it runs", file=sys.stderr)  # redirected above the display
    print("SUMMARY", file=out)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # colours, cursor moves
    assert "tiny: 2 clients, 2 rounds\n" in text and "printed while it runs\n" in text
    last = text.rstrip("\n").split("\n")
    assert last[-1] == "SUMMARY"  # on a line of its own, after the display's last drawing
    assert "round 2/2" in last[-2] and "test acc 0.500" in last[-2]
    assert "audit 1/2 attacks done" in last[-2]


def test_a_run_shows_progress_and_summary_without_library_noise(tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(
        'name = "tiny"\nrounds = 1\n[data]\nsource = "auto"\n'
        f'cifar10_dir = "{tmp_path / "no-cifar"}"\nsamples_per_client = 8\ntest_size = 20\n'
        "[model]\nwidth = 30\ndepth = 2\n[clients]\ncount = 2\nbatch_size = 4\n"
        "[audit.spearpp]\nstarts = 20\nsteps = 20\nmax_passes = 1\n"
    )
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "fl_sim.cli", "run", str(config), "--out", str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown[-3000:]
    assert not [n for n in NOISE if n in shown], shown
    # A real warning still shows, once (the ServerApp, in a process of flwr run's, loads the
    # data again): the data the user asked for is not there.
    assert "WARNING fl_sim.data.federated: CIFAR-10 not found" in done.stderr
    assert done.stderr.count("CIFAR-10 not found") == 1, done.stderr
    assert "round 1/1  test acc" in done.stderr and "attacks done" in done.stderr
    summary = done.stdout.splitlines()
    assert summary[1].startswith("Leakage audit") and summary[2].split()[:2] == [
        "client",
        "defence",
    ]
    assert f"run directory: {run_dir}" in done.stdout
    # Off the terminal, still on file: flwr run's output is in run.log.
    assert "Starting logstream" in (run_dir / "run.log").read_text()
    helped = subprocess.run(
        [sys.executable, "-m", "fl_sim.cli", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "usage: fl-sim" in helped.stdout and not [m for m in RST if m in helped.stdout]
    assert not helped.stderr


def test_font_fallbacks_are_not_shown_but_other_warnings_are(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A font cache built by another install lacks the families a log axis' tick labels ask
    # for: matplotlib warns once per family, and falls back.
    from fl_sim.terminal import configure_logging

    configure_logging(logging.INFO)
    logging.getLogger("matplotlib.font_manager").warning("findfont: Font family not found.")
    logging.getLogger("fl_sim.report").warning("a warning of our own")
    err = capsys.readouterr().err
    assert "findfont" not in err and "a warning of our own" in err
