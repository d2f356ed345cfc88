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
missing=()
for p in "${packages[@]}"; do
  [[ "$p" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "dtlab setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "dtlab setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
