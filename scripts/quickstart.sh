#!/usr/bin/env bash
# Sets up .venv if needed, then the main job: the attack benchmark's quick preset on real
# CIFAR-10 images (the local copy given by $CIFAR10, by default the shared test file).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fl-sim bench attack --preset quick --data "${CIFAR10:-../shared/data/cifar10_test_1000.npz}" "$@"
