"""Bad input stops a command with one line naming the file or key and what is wrong, exit
status 2 (argparse's for usage errors), and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _fl_sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fl_sim.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("run", "{tmp}/missing.toml"), "fl-sim run: scenario file {tmp}/missing.toml"),
        (("run", "configs/quickstart.toml", "--set", "rounds=-1"), "fl-sim run: rounds = -1"),
        (("attack", "{tmp}/empty.npz"), "fl-sim attack: {tmp}/empty.npz: "),
        (("audit", "{tmp}"), "fl-sim audit: {tmp}/updates holds no updates"),
    ],
    ids=["missing-scenario", "bad-key", "empty-update", "nothing-to-audit"],
)  # fmt: skip
def test_one_line_and_exit_status_2(tmp_path: Path, args: tuple[str, ...], line: str) -> None:
    (tmp_path / "empty.npz").write_bytes(b"")
    done = _fl_sim(*(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(line.format(tmp=tmp_path))
