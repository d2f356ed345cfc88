#!/usr/bin/env bash
# Docs that run: the README's five-minute tour, every command as it is written, and (with
# --quick-start) the quick start's headless run. Each must exit 0.
#
#   tools/readme_tour.sh DTLAB_BINARY [--quick-start]
#
# The commands run in a fresh temporary folder whose build/ is the folder of DTLAB_BINARY, so
# `build/dtlab ...` and `runs/...` mean what they mean in the README. Two lines cannot run as
# written without a person or a display, and are changed as little as possible (the change is
# printed): `dtlab lesson run ID` asks its questions on a terminal, so it gets `--answers auto`
# (the lesson's runs and checks are the same); `dtlab gui` opens a window, so it runs under
# xvfb-run with `--screenshot` (skipped, and said, without xvfb-run).
# The quick start: its block must hold exactly `tools/lab.sh` and `tools/test.sh`; CI runs
# tools/test.sh itself, and --quick-start runs tools/lab.sh without a display, as a user without
# one would (DTLAB_NO_SETUP=1: the build is there already).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dtlab=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
[[ -x $dtlab ]] || { echo "readme_tour: $1 is not an executable" >&2; exit 2; }
quick=0
[[ ${2:-} == --quick-start ]] && quick=1
readme=$root/README.md
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$(dirname "$dtlab")" "$work/build"
export XDG_DATA_HOME=$work/data XDG_CONFIG_HOME=$work/config   # lesson records, the window's layout

block() {  # the fenced sh block after the marker line matching $1, up to $2
  awk -v b="$1" -v e="$2" '$0 ~ b {on=1; next} $0 ~ e {on=0} on && !/^```/' "$readme"
}

quick_block=$(awk '/^## Quick start/ {on=1; next} on && /^```sh/ {inb=1; next} inb && /^```/ {exit} inb' "$readme" |
  sed 's/ *#.*//' | sed '/^$/d')
if [[ $quick_block != $'tools/lab.sh\ntools/test.sh' ]]; then
  echo "readme_tour: the quick start should be the two commands tools/lab.sh and tools/test.sh, it is:" >&2
  echo "$quick_block" >&2
  exit 1
fi

if ((quick)); then
  echo "== tools/lab.sh (headless, as without a display)"
  (cd "$root" && env -u DISPLAY -u WAYLAND_DISPLAY DTLAB_NO_SETUP=1 DTLAB="$dtlab" DTLAB_RUNS="$work/runs" tools/lab.sh)
  ls "$work"/runs/quickstart-*/summary.json >/dev/null
  echo "readme_tour: the quick start ran"
  exit 0
fi

mapfile -t lines < <(block '<!-- tour:begin' '<!-- tour:end' | sed '/^ *#/d; /^ *$/d')
((${#lines[@]} >= 5)) || { echo "readme_tour: found ${#lines[@]} tour commands in $readme" >&2; exit 1; }
cd "$work"
n=0
for line in "${lines[@]}"; do
  cmd=${line%%#*}
  if [[ $cmd == *"dtlab lesson run "* && $cmd != *--answers* ]]; then
    cmd="$cmd --answers auto"
    echo "== $line   [run with --answers auto: no terminal to answer on]"
  elif [[ $cmd == *"dtlab gui"* ]]; then
    if ! command -v xvfb-run >/dev/null; then
      echo "== $line   [skipped: no xvfb-run]"
      continue
    fi
    cmd="xvfb-run -a -s '-screen 0 1600x1000x24' $cmd --screenshot $work/gui.png"
    echo "== $line   [under xvfb-run, with --screenshot]"
    gui=1
  else
    echo "== $line"
  fi
  set +e
  bash -c "$cmd"
  rc=$?
  set -e
  if ((${gui:-0} && rc == 7)); then
    echo "   [skipped: this build has no GUI (exit 7)]"
    gui=0
    continue
  fi
  gui=0
  if ((rc != 0)); then
    echo "readme_tour: FAILED with exit $rc: $line" >&2
    exit 1
  fi
  n=$((n + 1))
done
echo "readme_tour: all $n tour commands ran"
