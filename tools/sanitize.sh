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
# tsan job builds without the GUI, MPI and the GPU backend, with the reference sgemm
# (-DDTLAB_WITH_BLAS=OFF: OpenBLAS's own threads are not instrumented, so ThreadSanitizer cannot
# see their synchronization), and dtlab_tests from the files of the tsan suites only
# (-DDTLAB_TEST_SUBSET=tsan, tests/CMakeLists.txt).
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
    flags="-fsanitize=thread -fno-omit-frame-pointer -gline-tables-only"
    cmake -S . -B build-tsan -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
      -DDTLAB_WITH_GUI=OFF -DDTLAB_WITH_MPI=OFF -DDTLAB_WITH_CUDA=OFF -DDTLAB_WITH_BLAS=OFF -DDTLAB_TEST_SUBSET=tsan \
      "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" >/dev/null
    cmake --build build-tsan -j"$(nproc)" --target dtlab dtlab_tests
    ctest --test-dir build-tsan --output-on-failure -j"$(nproc)" -L tsan
  fi
  echo "tools/sanitize.sh: $j passed in $(($(date +%s) - start)) s"
done
