#!/usr/bin/env bash
# Quick start: set up, build, and run the lab. On a desktop (DISPLAY or WAYLAND_DISPLAY set, and a
# build with the GUI) it opens the lab window, already training. Without a display it runs the
# lab's main job headless: 4 emulated ranks train the cnn on Fashion-MNIST with synchronized
# BatchNorm for 3 epochs, and the run directory lands in runs/quickstart.
# Extra arguments go to `dtlab gui` or `dtlab run` (they take the same flags, e.g. --model mlp).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
if [[ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]]; then
  # Exit code 7: no display could be opened, or this build has no GUI: run headless instead.
  code=0
  build/dtlab gui --model cnn --world-size 4 --batch-size 32 --bn sync "$@" || code=$?
  [[ $code -ne 7 ]] && exit $code
  echo "dtlab: running the headless job instead"
else
  echo "dtlab: no display (DISPLAY and WAYLAND_DISPLAY are unset): training headless, 3 epochs into runs/quickstart"
fi
exec build/dtlab run --model cnn --world-size 4 --batch-size 32 --bn sync --epochs 3 --out runs/quickstart "$@"
