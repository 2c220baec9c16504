#!/usr/bin/env bash
# The GPU rows of issue 18 in one go: B=100 and B=256 at m=4000 (3 seeds each) on CUDA, null
# steps by inverse iteration (the default) and then by eigh, each attack timed beside one full
# float64 SVD of the same gradient (--svd-reference); time per stage in each summary.md.
# Compare with the CPU rows in bench/results/. Needs the project set up (bash scripts/setup.sh)
# and a CUDA device.
# Usage: bash scripts/gpu_bench.sh CIFAR10.npz [OUT]
set -euo pipefail
DATA=${1:?usage: bash scripts/gpu_bench.sh CIFAR10.npz [OUT]}
OUT=${2:-bench/results/gpu}
FL=${FL_SIM:-.venv/bin/fl-sim}
.venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
for STEP in inverse eigh; do
  for B in 100 256; do
    "$FL" bench attack --batch-size "$B" --width 4000 --seeds 0,1,2 --null-step "$STEP" \
      --svd-reference --data "$DATA" --out "$OUT/b$B-$STEP"
  done
done
