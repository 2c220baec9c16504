#!/usr/bin/env bash
# Sets up .venv if needed, then lint, type check and the default (fast) test run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
.venv/bin/python -m pytest "$@"
