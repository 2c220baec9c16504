"""The import contract (`.importlinter`, run by scripts/test.sh) holds, and would catch the
threat model's breach: an attack module importing the simulated world."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fl_sim", "strategies", "clients", "attacks", "flsim_plugins")
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT), "--config", str(tree / ".importlinter"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / ".importlinter", tree / ".importlinter")
    return tree


def test_the_contract_holds(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_an_attack_that_imports_the_clients_breaks_it(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    (tree / "attacks" / "peek.py").write_text("import clients\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "attacks.peek -> clients" in result.stdout


def test_a_server_core_that_imports_flower_breaks_it(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    (tree / "strategies" / "core" / "grid.py").write_text("import flwr.serverapp\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "strategies.core.grid -> flwr" in result.stdout
