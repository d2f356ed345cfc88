#!/usr/bin/env bash
# The lab window's cost, measured in one run on this machine: the same training (8 emulated
# ranks by default) headless with `dtlab run` and with `dtlab gui` open on a virtual display
# (Xvfb + Mesa), interleaved (headless, gui, headless, gui, ...), best of 3 each: this machine is
# shared and noisy, and the best run is the one least disturbed. Prints the GUI's
# frame times (p50, p95, p99, max of each drawn frame) and, as the last line, the throughput
# ratio `gui/headless <ratio>` (samples/s as summary.json reports it: evaluation excluded).
#
# frame ms is the time to produce a drawn frame, over the frames drawn while the ranks train
# (viz/data/frame_stats.h: not those while data loads or after the run); each round also prints
# the time between frames (interval), how late frames started (late: waiting for a CPU), and the
# GUI thread's wall/CPU ms per frame in its parts (news, ui, render, swap).
#
# Usage: tools/gui_perf.sh [flags for both runs, default: --model mlp --world-size 8
#                           --batch-size 32 --steps 600 --eval-every 50 --limit-test 2000]
#                          [-- flags for dtlab gui only, e.g. --rank-nice 0]
# Needs: a dtlab built with the GUI (tools/setup.sh), xvfb-run, the dataset.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/dtlab ]] || tools/setup.sh
command -v xvfb-run >/dev/null || { echo "xvfb-run is not installed: apt-get install xvfb xauth" >&2; exit 2; }
args=() gui_args=()
while (($#)); do
  if [[ "$1" == "--" ]]; then shift; gui_args=("$@"); break; fi
  args+=("$1"); shift
done
((${#args[@]})) || args=(--model mlp --world-size 8 --batch-size 32 --steps 600 --eval-every 50 --limit-test 2000)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# ${args[*]}${gui_args[*]:+ | gui: ${gui_args[*]}} | $(nproc) cores | window 1600x1000 on Xvfb"

# "samples_per_s": 1234.5 from a JSON file
json_number() { sed -n "s/.*\"$1\": *\([0-9.eE+-]*\).*/\1/p" "$2" | head -1; }

# {"p50":1.5,...} of a flat object "key" in a JSON file, numbers rounded to 0.1
flat_object() {
  tr -d '\n ' < "$2" | sed -n "s/.*\"$1\":{\([^{}]*\)}.*/\1/p" |
    awk -F, '{for (i = 1; i <= NF; ++i) {split($i, kv, ":"); printf "%s%s %.1f", (i > 1 ? ", " : ""), kv[1], kv[2]}}' |
    tr -d '"'
}
# "news 0.4/0.3, ui 3.1/2.9, ..." (wall/cpu ms) from parts_mean_ms
parts() {
  local out="" p
  for p in news ui render swap; do
    out+=$(tr -d '\n ' < "$1" | sed -n "s/.*\"$p\":{\"cpu\":\([0-9.eE+-]*\),\"wall\":\([0-9.eE+-]*\)}.*/$p \2 \1/p" |
           awk '{printf "%s%s %.1f/%.1f", "", $1, $2, $3}')
    [[ $p == swap ]] || out+=", "
  done
  echo "$out"
}

best_cli=0 best_gui=0 best_frames=""
for round in 1 2 3; do
  build/dtlab run "${args[@]}" --out "$tmp/cli$round" > "$tmp/cli$round.log" 2>&1 ||
    { cat "$tmp/cli$round.log" >&2; exit 1; }
  c=$(json_number samples_per_s "$tmp/cli$round/summary.json")
  XDG_CONFIG_HOME="$tmp/config" xvfb-run -a -s "-screen 0 1600x1000x24" \
    build/dtlab gui "${args[@]}" "${gui_args[@]}" --frame-stats "$tmp/gui$round.json" > "$tmp/gui$round.log" 2>&1 ||
    { cat "$tmp/gui$round.log" >&2; exit 1; }
  g=$(json_number samples_per_s "$tmp/gui$round.json")
  f=$(flat_object frame_ms "$tmp/gui$round.json")
  n=$(json_number frames "$tmp/gui$round.json")
  na=$(json_number all_frames "$tmp/gui$round.json")
  p=$(json_number drawn_fraction_mean "$tmp/gui$round.json")
  printf 'round %d: headless %.0f samples/s, gui %.0f samples/s; gui frame ms {%s} over %s frames drawn while training (%s in all; each painting %.2f of the window)\n' \
    "$round" "$c" "$g" "$f" "$n" "$na" "$p"
  echo "  interval ms {$(flat_object interval_ms "$tmp/gui$round.json")}, late ms {$(flat_object late_ms "$tmp/gui$round.json")}"
  echo "  per frame, wall/cpu ms: $(parts "$tmp/gui$round.json")"
  best_cli=$(awk -v a="$best_cli" -v b="$c" 'BEGIN {print (b > a ? b : a)}')
  if awk -v a="$best_gui" -v b="$g" 'BEGIN {exit !(b > a)}'; then best_gui=$g; best_frames=$f; fi
done
printf 'headless %.0f samples/s (best of 3)\n' "$best_cli"
printf 'gui %.0f samples/s (best of 3), its frame ms: {%s} (target p95 <= 16.7)\n' "$best_gui" "$best_frames"
awk -v g="$best_gui" -v c="$best_cli" 'BEGIN {printf "gui/headless %.2f\n", g / c}'
