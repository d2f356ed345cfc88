#!/usr/bin/env bash
# The one AddressSanitizer + UndefinedBehaviorSanitizer build, build-asan/, shared by
# tools/sanitize.sh asan (dtlab and the unit tests) and tools/fuzz.sh (the libFuzzer harnesses):
# both call this script with the targets they need, so the libraries are compiled once.
#
#   tools/asan_build.sh TARGET...
#
# clang, -fsanitize=address,undefined -fno-sanitize-recover=all everywhere, and DTLAB_FUZZ=ON:
# the libraries also carry libFuzzer's coverage instrumentation (-fsanitize=fuzzer-no-link, see
# fuzz/CMakeLists.txt), which the harnesses need and which changes no result elsewhere. OpenBLAS
# is kept, the sgemm every other build tests with (it reports nothing under ASan; the reference
# kernel is still checked, by the Gemm tests). No GUI, MPI or GPU backend: none is needed by the
# tests that run here and their libraries are not instrumented (nvcc links the GPU tests with
# gcc's ASan runtime, which clang's refuses, and without a GPU they only skip).
# -gline-tables-only: the sanitizers' reports name file and line of every frame, as with -g, and
# the compile skips the full debug information (a fifth of its time).
set -euo pipefail
cd "$(dirname "$0")/.."
(($#)) || { echo "tools/asan_build.sh: name the targets to build (dtlab dtlab_tests, fuzz_lesson, ...)" >&2; exit 2; }

tools/install_packages.sh clang libclang-rt-14-dev llvm-14 cmake make libgtest-dev zlib1g-dev \
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libopenblas-dev dataset-fashion-mnist

flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -gline-tables-only"
cmake -S . -B build-asan -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
  -DDTLAB_WITH_GUI=OFF -DDTLAB_WITH_MPI=OFF -DDTLAB_WITH_CUDA=OFF -DDTLAB_WITH_BLAS=ON -DDTLAB_FUZZ=ON \
  "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" >/dev/null
cmake --build build-asan -j"$(nproc)" --target "$@"
