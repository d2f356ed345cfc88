#!/usr/bin/env bash
# Quick start: set up, build, and run the lab's main job: 4 emulated ranks train the cnn on
# Fashion-MNIST with synchronized BatchNorm; the run directory lands in runs/quickstart.
# Extra arguments are passed to `dtlab run` (e.g. --model mlp --epochs 1).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
exec build/dtlab run --model cnn --world-size 4 --batch-size 32 --bn sync --epochs 3 --out runs/quickstart "$@"
