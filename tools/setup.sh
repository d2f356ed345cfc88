#!/usr/bin/env bash
# Installs what dtlab needs on Debian 12 (only what is missing) and builds it into build/.
# Safe to run any number of times. Usage: tools/setup.sh [extra cmake flags]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake         # compiler and build
  libgtest-dev                  # tests
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev zlib1g-dev
  libopenblas-dev               # fast sgemm (the build falls back to a reference kernel without it)
  openmpi-bin libopenmpi-dev    # --comm mpi: ranks as processes (the build leaves it out without them)
  dataset-fashion-mnist         # the data: /usr/share/datasets/fashion-mnist
  libimgui-dev libglfw3-dev libstb-dev fonts-dejavu-core   # the lab window, dtlab gui (optional)
  xvfb xauth libgl1-mesa-dri xdotool   # its tests on a virtual display (skipped without xvfb-run)
)
tools/install_packages.sh "${packages[@]}"

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
