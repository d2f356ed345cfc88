#!/usr/bin/env bash
# Builds build-tsan/, the ThreadSanitizer build tools/sanitize.sh's tsan job tests: without the
# GUI, MPI and the GPU backend, with the reference sgemm (-DDTLAB_WITH_BLAS=OFF: OpenBLAS's own
# threads are not instrumented, so ThreadSanitizer cannot see their synchronization), and
# dtlab_tests from the files of the tsan suites only (-DDTLAB_TEST_SUBSET=tsan,
# tests/CMakeLists.txt). Installs clang and its runtimes first (tools/install_packages.sh).
#
#   tools/tsan_build.sh            dtlab and dtlab_tests (what the tsan tests run)
set -euo pipefail
cd "$(dirname "$0")/.."

tools/install_packages.sh clang libclang-rt-14-dev llvm-14 cmake make libgtest-dev zlib1g-dev \
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev dataset-fashion-mnist

flags="-fsanitize=thread -fno-omit-frame-pointer -gline-tables-only"
cmake -S . -B build-tsan -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
  -DDTLAB_WITH_GUI=OFF -DDTLAB_WITH_MPI=OFF -DDTLAB_WITH_CUDA=OFF -DDTLAB_WITH_BLAS=OFF -DDTLAB_TEST_SUBSET=tsan \
  "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" >/dev/null
cmake --build build-tsan -j"$(nproc)" --target dtlab dtlab_tests
