#!/usr/bin/env bash
# Set up, build, and run the test suite (everything but the long full-dataset runs).
# tools/test.sh --long runs the long ones too (label "long": several minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
args=(--test-dir build --output-on-failure -j"$(nproc)")
if [[ "${1:-}" == "--long" ]]; then
  ctest "${args[@]}"
else
  ctest "${args[@]}" -LE long
fi
