#!/usr/bin/env bash
# Fuzzes every parser of outside input with libFuzzer (fuzz/fuzz_<target>.cpp): builds the
# harnesses with clang into build-asan/ (-fsanitize=fuzzer,address,undefined; tools/asan_build.sh,
# the build tools/sanitize.sh asan uses too), runs each target
# for the given time on a copy of its seed corpus (fuzz/corpus/<target>/), and prints a table.
#
#   tools/fuzz.sh                    every target, 60 s each
#   tools/fuzz.sh --seconds 20       what CI runs
#   tools/fuzz.sh lesson expr        some targets
#   tools/fuzz.sh --build-only       builds the harnesses (build-asan/fuzz) and runs none
#   --jobs N                         targets fuzzed at once (default: the cores, nproc)
#
# Exits 1 when a target finds a crash, an uncaught exception, a sanitizer report, a leak, a
# timeout (10 s for one input) or an out-of-memory (2 GB): its input is kept as
# build-asan/findings/<target>-<kind>-<sha1>, and build-asan/findings/<target>.repro holds the
# command that reproduces it (the fuzzer's output is build-asan/findings/<target>.log). The
# inputs the fuzzer adds to its corpus stay under build-asan/runs/<target>/corpus; the committed
# seeds are not changed (a finding becomes a regression test in tests/ instead).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
jobs=$(nproc)
build_only=0
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "tools/fuzz.sh: unknown option $1 (--seconds N, --jobs N, --build-only, then target names)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "tools/fuzz.sh: --jobs must be a positive whole number (got '$jobs')" >&2; exit 2; }
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "tools/fuzz.sh: --seconds must be a positive whole number (got '$seconds')" >&2; exit 2; }
all_targets=(dataset safetensors config run_dir lesson expr layout bn_stats checkpoint)
((${#targets[@]})) || targets=("${all_targets[@]}")

# The harnesses are built in build-asan/, the AddressSanitizer + UndefinedBehaviorSanitizer build
# tools/sanitize.sh asan tests (tools/asan_build.sh: its libraries carry libFuzzer's coverage
# instrumentation), so after that job only the harnesses themselves compile here.
tools/asan_build.sh $(printf 'fuzz_%s ' "${targets[@]}")
((build_only)) && exit 0
build=build-asan

symbolizer=/usr/lib/llvm-14/bin/llvm-symbolizer
[[ -x "$symbolizer" ]] && export ASAN_SYMBOLIZER_PATH="$symbolizer" UBSAN_SYMBOLIZER_PATH="$symbolizer"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="abort_on_error=0:detect_leaks=1"

findings="$build/findings"
mkdir -p "$findings"
# The harnesses that read files write them into a scratch folder under TMPDIR: memory (/dev/shm)
# when there is one (ten times the executions of a disk), removed at the end even after a crash.
scratch_root=/dev/shm
[[ -d "$scratch_root" && -w "$scratch_root" ]] || scratch_root="$PWD/$build"
scratch=$(mktemp -d "$scratch_root/dtlab-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# fuzz_one TARGET: runs one target; writes its table row to $build/runs/TARGET/row and exits 1 on
# a finding.
fuzz_one() {
  local t="$1" exe="$build/fuzz/fuzz_$1" seeds="fuzz/corpus/$1" work="$build/runs/$1"
  local rc=0 start elapsed execs files bytes result artifact kind
  rm -rf "$work" "$findings/$t".* "$findings/$t"-*
  mkdir -p "$work/corpus"
  cp "$seeds"/* "$work/corpus/"
  echo "fuzz: $t for ${seconds} s ..."
  start=$(date +%s)
  TMPDIR="$scratch" "$exe" "$work/corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/$t-" > "$work/log" 2>&1 || rc=$?
  elapsed=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  files=$(find "$work/corpus" -type f | wc -l)
  bytes=$(find "$work/corpus" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  if ((rc == 0)); then
    result="ok"
  else
    artifact=$(ls -t "$findings/$t"-* 2>/dev/null | head -1 || true)
    cp "$work/log" "$findings/$t.log"
    if [[ -n "$artifact" ]]; then
      kind=$(basename "$artifact" | sed "s/^$t-//; s/-.*//")
      echo "$exe $artifact" > "$findings/$t.repro"
      result="FAILED: $kind, input $artifact, reproduce: $exe $artifact"
    else
      result="FAILED (exit $rc, no input kept): see $findings/$t.log"
    fi
    grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|terminate called|SUMMARY' \
      "$work/log" | sed "s/^/  $t: /" || true
  fi
  printf '%-12s %8s %12s %8s %10s  %s\n' "$t" "$elapsed" "${execs:-?}" "$files" "$bytes" "$result" > "$work/row"
  ((rc == 0))
}

# One target per core at a time (a libFuzzer process uses one): each still gets its full time.
for t in "${targets[@]}"; do
  [[ -d "fuzz/corpus/$t" ]] || { echo "tools/fuzz.sh: no seed corpus fuzz/corpus/$t" >&2; exit 2; }
done
failed=0
running=0
for t in "${targets[@]}"; do
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
rows=()
for t in "${targets[@]}"; do rows+=("$(cat "$build/runs/$t/row")"); done

echo
printf '%-12s %8s %12s %8s %10s  %s\n' target seconds executions files bytes result
for r in "${rows[@]}"; do echo "$r"; done
seed_files=$(find fuzz/corpus -type f | wc -l)
seed_bytes=$(find fuzz/corpus -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
echo "(files, bytes: each target's corpus after the run; the committed seeds: $seed_files files, $seed_bytes bytes)"
exit "$failed"
