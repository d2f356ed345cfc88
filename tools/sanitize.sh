#!/usr/bin/env bash
# Builds dtlab with clang's sanitizers and runs the tests under them. Exits non-zero on any
# sanitizer report (every one aborts the test that hits it) or failed test.
#
#   tools/sanitize.sh              both jobs
#   tools/sanitize.sh asan         AddressSanitizer + UndefinedBehaviorSanitizer
#                                  (-fno-sanitize-recover=all), build-asan/: the unit tests
#                                  (ctest -L unit) but the ones below
#   tools/sanitize.sh tsan         ThreadSanitizer, build-tsan/: ctest -L tsan, the tests where
#                                  threads meet (tests/CMakeLists.txt: the threads transport, run
#                                  control, comm overlap, lesson driver)
#
# The asan job builds through tools/asan_build.sh: build-asan/ is the build tools/fuzz.sh uses
# too (one instrumented compile of the libraries for both; its header says what it holds). The
# tsan job builds through tools/tsan_build.sh (its header says what build-tsan/ holds). Either
# build may be made beforehand (CI compiles both in the background while the other tests run):
# the build here then has nothing left to do.
# Left out (asan_exclude below): the GUI's unit tests, skipped anyway without a GUI build. The
# other labels (long, parity, lesson, torch) are not unit tests: full-dataset runs, PyTorch
# fixtures and whole lessons, minutes under a sanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=("$@")
((${#jobs[@]})) || jobs=(asan tsan)
for j in "${jobs[@]}"; do
  [[ "$j" == asan || "$j" == tsan ]] || { echo "tools/sanitize.sh: unknown job '$j' (asan, tsan)" >&2; exit 2; }
done

tools/install_packages.sh clang libclang-rt-14-dev llvm-14 cmake make libgtest-dev zlib1g-dev \
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev dataset-fashion-mnist

symbolizer=/usr/lib/llvm-14/bin/llvm-symbolizer
if [[ -x "$symbolizer" ]]; then
  export ASAN_SYMBOLIZER_PATH="$symbolizer" UBSAN_SYMBOLIZER_PATH="$symbolizer" TSAN_SYMBOLIZER_PATH="$symbolizer"
fi
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"

asan_exclude='^Gui'  # the lab window's tests: skipped anyway in a build without the GUI

for j in "${jobs[@]}"; do
  start=$(date +%s)
  if [[ "$j" == asan ]]; then
    tools/asan_build.sh dtlab dtlab_tests
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -L unit -E "$asan_exclude"
  else
    tools/tsan_build.sh
    ctest --test-dir build-tsan --output-on-failure -j"$(nproc)" -L tsan
  fi
  echo "tools/sanitize.sh: $j passed in $(($(date +%s) - start)) s"
done
