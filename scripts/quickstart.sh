#!/usr/bin/env bash
# Sets up .venv if needed, then the main job: the quickstart federation (configs/quickstart.toml),
# offline by default. Extra arguments go to `fl-sim run` (e.g. --set rounds=5, --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fl-sim run configs/quickstart.toml "$@"
