#!/usr/bin/env bash
# The GPU rows of the "beyond the paper" issue in one go: B=100 and B=210 at m=4000 (3 seeds
# each, null steps by inverse iteration, then by eigh) on CUDA, time per stage in each summary.md.
# Compare with the CPU rows in bench/results/. Needs the project set up (bash scripts/setup.sh) and a CUDA device.
# Usage: bash scripts/gpu_bench.sh CIFAR10.npz [OUT]
set -euo pipefail
DATA=${1:?usage: bash scripts/gpu_bench.sh CIFAR10.npz [OUT]}
OUT=${2:-bench/results/gpu}
FL=${FL_SIM:-.venv/bin/fl-sim}
.venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
"$FL" bench attack --batch-size 100 --width 4000 --seeds 0,1,2 --data "$DATA" --out "$OUT/b100"
"$FL" bench attack --preset beyond --only "signs B=210" --data "$DATA" --out "$OUT/b210"
# The same with the exact eigh null steps (the default on CUDA is inverse iteration).
for B in 100 210; do
  "$FL" bench attack --batch-size "$B" --width 4000 --seeds 0,1,2 --null-step eigh \
    --data "$DATA" --out "$OUT/b$B-eigh"
done
