#!/usr/bin/env bash
# Quick start: set up, build, and run the lab. On a desktop (DISPLAY or WAYLAND_DISPLAY set, and a
# build with the GUI) it opens the lab window, already training. Without a display it runs the
# lab's main job headless: 4 emulated ranks train the cnn on Fashion-MNIST with synchronized
# BatchNorm for 3 epochs, and the run directory lands in a new runs/quickstart-<date>-<time>.
# Extra arguments go to `dtlab gui` or `dtlab run` (they take the same flags, e.g. --model mlp).
# For tests and scripts: DTLAB_NO_SETUP=1 skips tools/setup.sh (the build is there), DTLAB names the
# dtlab binary (default build/dtlab), DTLAB_RUNS the folder of run directories (default runs).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n "${DTLAB_NO_SETUP:-}" ]] || tools/setup.sh
dtlab=${DTLAB:-build/dtlab}
runs=${DTLAB_RUNS:-runs}
if [[ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]]; then
  # Exit code 7: no display could be opened, or this build has no GUI: run headless instead.
  code=0
  "$dtlab" gui --model cnn --world-size 4 --batch-size 32 --bn sync "$@" || code=$?
  [[ $code -ne 7 ]] && exit $code
  echo "dtlab: running the headless job instead"
else
  echo "dtlab: no display (DISPLAY and WAYLAND_DISPLAY are unset): training headless, 3 epochs"
fi
# A new run directory every time (runs/quickstart-<date>-<time>[-n]): an earlier run is never
# replaced. An --out among the arguments wins (dtlab takes a flag's last value).
stamp=$(date +%Y%m%d-%H%M%S)
out="$runs/quickstart-$stamp"
n=2
while [[ -e "$out" ]]; do out="$runs/quickstart-$stamp-$n"; n=$((n + 1)); done
for a in "$@"; do [[ $a == --out || $a == --out=* ]] && out=""; done
[[ -n $out ]] && echo "dtlab: this run's directory: $out"
exec "$dtlab" run --model cnn --world-size 4 --batch-size 32 --bn sync --epochs 3 ${out:+--out "$out"} "$@"
