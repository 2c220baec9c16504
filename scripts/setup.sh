#!/usr/bin/env bash
# Creates .venv with fl-sim and its dependencies, once; later calls return at once.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/fl-sim ] || [ pyproject.toml -nt .venv/.installed ]; then
  python3 -m venv .venv
  # torch and torchvision pinned first: these builds lie on the development machines' disk
  # (an unpinned torch would download several GB).
  .venv/bin/pip install --quiet torch==2.14.1 torchvision==0.29.1
  .venv/bin/pip install --quiet -e '.[dev]'
  touch .venv/.installed
fi
