#!/usr/bin/env bash
# Fault drills: break a run on purpose, every way we know, and print one table saying what was
# expected, what happened, how long dtlab took to tell, and what was lost.
#
#   tools/fault_drills.sh [BUILD_DIR]      (default: build; needs the dataset, mpirun for the MPI row)
#
# A drill passes when the exit code and the message are the expected ones and nothing that was
# committed is lost (for the checkpoint drills: the resumed run ends bit for bit where the
# uninterrupted one does). The script exits 1 when any drill fails.
set -u
BUILD=${1:-build}
DTLAB=$(cd "$BUILD" && pwd)/dtlab
[ -x "$DTLAB" ] || { echo "fault_drills: $DTLAB not built (cmake --build $BUILD)" >&2; exit 2; }
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dtlab-drills.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SMALL="--model cnn --world-size 2 --batch-size 32 --limit-train 1024 --limit-test 256 --epochs 2 --momentum 0.9 --threads 1"
# long enough (several seconds) to be interrupted and killed in the middle
LONG="--model cnn --world-size 2 --batch-size 32 --limit-train 6144 --limit-test 256 --epochs 2 --momentum 0.9 --threads 1"
ROWS=()
FAILED=0

# row DRILL EXPECTED HAPPENED SECONDS LOST OK
row() {
  ROWS+=("$1|$2|$3|$4|$5|$6")
  [ "$6" = yes ] || FAILED=1
}

# run_timed OUTFILE CMD...: runs, sets RC and SECS
run_timed() {
  local out=$1
  shift
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >"$out" 2>&1
  RC=$?
  t1=$(date +%s.%N)
  SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
}

# what dtlab printed, shortened for the table: the line the drill looks for, else the first error
said() {
  { grep -a -m1 -E "$2" "$1" || grep -a -m1 "error" "$1"; } | tr -d '\r' | sed 's/^.*dtlab: //' | cut -c1-100
}

# drill NAME EXPECTED_RC MESSAGE_REGEX EXPECTED_TEXT LOST CMD...
drill() {
  local name=$1 want_rc=$2 pattern=$3 expected=$4 lost=$5
  shift 5
  run_timed "$WORK/out.txt" "$@"
  local ok=no
  if [ "$RC" = "$want_rc" ] && grep -a -q -E "$pattern" "$WORK/out.txt"; then ok=yes; fi
  row "$name" "$expected" "exit $RC: $(said "$WORK/out.txt" "$pattern")" "$SECS" "$lost" "$ok"
}

same_final() { cmp -s "$1/final.safetensors" "$2/final.safetensors"; }

echo "fault drills: $("$DTLAB" version)" >&2
"$DTLAB" run $SMALL --out "$WORK/ref" >/dev/null 2>&1 || { echo "fault_drills: the reference run failed" >&2; exit 1; }
"$DTLAB" run $LONG --out "$WORK/ref-long" >/dev/null 2>&1 || { echo "fault_drills: the reference run failed" >&2; exit 1; }

# waits until DIR/metrics.jsonl has at least N lines (the run is training)
wait_lines() {
  for _ in $(seq 300); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l <"$1/metrics.jsonl")" -ge "$2" ] && return 0
    sleep 0.02
  done
}

drill "rank throws" 5 "rank 1 failed: injected failure" "exit 5, names rank 1 and where the others were" "nothing: no run directory" \
  "$DTLAB" run $SMALL --fail-rank 1 --fail-step 3 --fail-at backward --timeout 20
drill "rank hangs" 6 "timed out after 2 s waiting for rank 1" "exit 6 after --timeout 2, names the hung rank" "nothing: no run directory" \
  "$DTLAB" run $SMALL --fail-rank 1 --fail-step 3 --fail-at hang --timeout 2
drill "uneven data, no --join" 6 "uneven inputs without --join: rank 1 ran out" "exit 6, says who ran out and who waited" "nothing: no run directory" \
  "$DTLAB" run $SMALL --uneven-data --timeout 2
drill "NaN injected (stop)" 5 "gradient of .* is NaN before the allreduce" "exit 5, rank/iteration/parameter, before the allreduce" "nothing: no run directory" \
  "$DTLAB" run $SMALL --fail-rank 1 --fail-step 3 --fail-at nan
drill "NaN injected (skip-step)" 0 "non-finite gradients: 1 iterations without an optimizer step" "exit 0, the step skipped on every rank" "one optimizer step (by design)" \
  "$DTLAB" run $SMALL --fail-rank 1 --fail-step 3 --fail-at nan --on-nonfinite skip-step
drill "bad flag" 2 "unknown flag --wrld-size \(did you mean --world-size\?\)" "exit 2, names the flag and the closest one" "nothing" \
  "$DTLAB" run --wrld-size 2
drill "bad value" 2 "batch_size should be a positive integer value" "exit 2, PyTorch's wording" "nothing" \
  "$DTLAB" run --batch-size 0

# a truncated dataset file
mkdir -p "$WORK/data"
for f in /usr/share/datasets/fashion-mnist/*.gz; do cp "$f" "$WORK/data/"; done
head -c 5000 /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz >"$WORK/data/train-images-idx3-ubyte.gz"
drill "truncated dataset" 3 "train-images-idx3-ubyte.gz" "exit 3, names the file" "nothing: nothing started" \
  "$DTLAB" run $SMALL --data-dir "$WORK/data"

# a lesson file with a TOML error
printf 'id = "broken"\ntitle = "broken\n' >"$WORK/broken.toml"
drill "corrupt lesson" 2 "broken.toml:2" "exit 2, file:line of the problem" "nothing" \
  "$DTLAB" lesson check "$WORK/broken.toml"

# unwritable run directory, and a disk that fills up (a 64 KiB file size limit)
drill "unwritable --out" 4 "cannot create run directory" "exit 4 before training, names the directory" "nothing: nothing started" \
  "$DTLAB" run $SMALL --out /proc/dtlab-drill
# the same command typed again over a finished run, and over an interrupted one: refused, nothing replaced
sum_before=$(md5sum <"$WORK/ref/final.safetensors")
drill "rerun over a finished run" 4 "already holds a finished run .*does not replace a run unasked" \
  "exit 4 before training, says what is there, offers --overwrite" "nothing: the earlier run is intact" \
  "$DTLAB" run $SMALL --out "$WORK/ref"
[ "$(md5sum <"$WORK/ref/final.safetensors")" = "$sum_before" ] || row "rerun over a finished run: files" "unchanged" "final.safetensors changed" "-" "the earlier run" "no"
drill "disk full" 4 "cannot write .*(metrics.jsonl|bn_stats.bin|safetensors|trace.json)" "exit 4, names the file that could not be written" "the run (the directory says how far it got)" \
  bash -c "ulimit -f 64; trap '' XFSZ; exec \"$DTLAB\" run $SMALL --out \"$WORK/full\""

# SIGINT: a checkpoint at the next iteration, summary marked interrupted, exit 130; resume = uninterrupted
"$DTLAB" run $LONG --out "$WORK/int" >"$WORK/int.txt" 2>&1 &
pid=$!
wait_lines "$WORK/int" 40
t0=$(date +%s.%N)
kill -INT $pid
wait $pid
rc=$?
t1=$(date +%s.%N)
# the same command again instead of --resume: refused, pointing at --resume; the checkpoint stays
run_timed "$WORK/int-again.txt" "$DTLAB" run $LONG --out "$WORK/int"
ok=no
grep -q "already holds an interrupted run .*with checkpoints up to step" "$WORK/int-again.txt" &&
  grep -q "dtlab run --resume $WORK/int" "$WORK/int-again.txt" && [ "$RC" = 4 ] && ok=yes
row "rerun over an interrupted run" "exit 4, names the checkpoint, gives the --resume command" \
  "exit $RC: $(said "$WORK/int-again.txt" 'already holds')" "$SECS" "nothing: the checkpoint is intact (resumed below)" "$ok"
"$DTLAB" run --resume "$WORK/int" >/dev/null 2>&1
lost="nothing: resumed = uninterrupted"
same_final "$WORK/ref-long" "$WORK/int" || lost="final weights differ"
ok=no
[ $rc = 130 ] && grep -q "stopped at iteration" "$WORK/int.txt" && same_final "$WORK/ref-long" "$WORK/int" && ok=yes
row "SIGINT" "exit 130 with a checkpoint; resume gives the same run" "exit $rc: $(said "$WORK/int.txt" 'stopped at')" \
  "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" "$lost" "$ok"

# SIGKILL at random moments while checkpoints are written every iteration (often mid-write)
rm -rf "$WORK/kill"
kills=0
for lines in 30 70 110 150; do
  if [ -d "$WORK/kill/checkpoints" ] && ls "$WORK/kill/checkpoints" | grep -q '^step-'; then
    args=(--resume "$WORK/kill")
  else
    args=($LONG --checkpoint-every 1 --out "$WORK/kill" --overwrite)  # (a kill before the first checkpoint)
  fi
  "$DTLAB" run "${args[@]}" >/dev/null 2>&1 &
  pid=$!
  wait_lines "$WORK/kill" $lines
  sleep "0.0$((RANDOM % 10))"
  kill -KILL $pid 2>/dev/null && kills=$((kills + 1))
  wait $pid 2>/dev/null
done
run_timed "$WORK/kill.txt" "$DTLAB" run --resume "$WORK/kill"
ok=no
lost="nothing: resumed = uninterrupted"
same_final "$WORK/ref-long" "$WORK/kill" && [ "$RC" = 0 ] && [ $kills -gt 0 ] && ok=yes
[ $ok = yes ] || lost="final weights differ (exit $RC, $kills kills)"
row "SIGKILL x$kills (checkpoint every iteration)" "a committed checkpoint survives; resume gives the same run" "exit $RC after resuming" "-" "$lost" "$ok"

# a damaged newest checkpoint: resume says so and takes the one before
"$DTLAB" run $SMALL --checkpoint-every 10 --out "$WORK/corrupt" >/dev/null 2>&1
newest=$(ls -d "$WORK/corrupt/checkpoints/step-"* | sort | tail -1)
printf 'garbage' | dd of="$newest/rank1.safetensors" bs=1 seek=100 conv=notrunc 2>/dev/null
run_timed "$WORK/corrupt.txt" "$DTLAB" run --resume "$WORK/corrupt"
ok=no
grep -q "is not used: rank1.safetensors does not match its checksum" "$WORK/corrupt.txt" && [ "$RC" = 0 ] &&
  same_final "$WORK/ref" "$WORK/corrupt" && ok=yes
row "corrupt checkpoint" "skipped with its name and why; the one before resumes" \
  "exit $RC: $(said "$WORK/corrupt.txt" 'is not used')" "$SECS" \
  "$([ $ok = yes ] && echo "10 iterations recomputed" || echo "run differs")" "$ok"

# an MPI rank killed (SIGKILL): the survivors name it before mpirun does; the checkpoint stays
if command -v mpirun >/dev/null && "$DTLAB" version | grep -q mpi; then
  MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none --timeout 120"
  t0=$(date +%s.%N)
  $MPIRUN -np 3 "$DTLAB" run --comm mpi --model cnn --batch-size 32 --limit-train 6000 --limit-test 256 --epochs 3 \
    --momentum 0.9 --threads 1 --timeout 20 --checkpoint-every 10 --out "$WORK/mpi" >"$WORK/mpi.txt" 2>&1 &
  mpipid=$!
  for _ in $(seq 100); do
    [ -d "$WORK/mpi/checkpoints" ] && ls "$WORK/mpi/checkpoints" | grep -q '^step-' && break
    sleep 0.1
  done
  victim=$(pgrep -f "dtlab run --comm mpi" | sort -n | sed -n 3p)
  t_kill=$(date +%s.%N)
  kill -KILL "$victim"
  wait $mpipid
  rc=$?
  t1=$(date +%s.%N)
  ok=no
  msg=$(said "$WORK/mpi.txt" "SIGTERM while waiting for rank")
  before=$(grep -a -n "SIGTERM while waiting" "$WORK/mpi.txt" | head -1 | cut -d: -f1)
  mpimsg=$(grep -a -n "mpirun noticed" "$WORK/mpi.txt" | head -1 | cut -d: -f1)
  has_ck=no
  (cd "$WORK" && "$DTLAB" run --comm threads --resume "$WORK/mpi" --out "$WORK/mpi-resumed" >/dev/null 2>&1) && has_ck=yes
  [ -n "$msg" ] && [ -n "$before" ] && [ -n "$mpimsg" ] && [ "$before" -lt "$mpimsg" ] && [ $has_ck = yes ] && ok=yes
  row "MPI rank killed" "survivors name the vanished rank before mpirun; checkpoint kept" "exit $rc: $msg" \
    "$(awk -v a="$t_kill" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" \
    "$([ $has_ck = yes ] && echo "iterations since the last checkpoint (resumable)" || echo "no usable checkpoint")" "$ok"
else
  row "MPI rank killed" "survivors name the vanished rank" "skipped: no mpirun or no MPI transport in this build" "-" "-" "yes"
fi

printf '\n| drill | expected | what happened | seconds | lost | as expected |\n|---|---|---|---|---|---|\n'
for r in "${ROWS[@]}"; do
  IFS='|' read -r a b c d e f <<<"$r"
  printf '| %s | %s | %s | %s | %s | %s |\n' "$a" "$b" "$c" "$d" "$e" "$f"
done
n=${#ROWS[@]}
echo
[ $FAILED = 0 ] && echo "fault drills: all $n as expected" || echo "fault drills: some drills did not go as expected"
exit $FAILED
