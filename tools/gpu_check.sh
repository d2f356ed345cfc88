#!/usr/bin/env bash
# The GPU backend's checks on a GPU machine, in one command, under 8 minutes (GPU_CHECK_SECONDS,
# default 450), writing gpu_check.json after every stage.
#
#   tools/gpu_check.sh --pack [--pack-dir .gpu-pack] [--arch "80;90"]
#        on a machine without a GPU: build the pack (tools/gpu/make_pack.sh: dtlab, its GPU module,
#        the op tests, a Fashion-MNIST subset; it needs nothing on the GPU machine but glibc, the
#        NVIDIA driver and PyTorch's nvidia-* wheels) and print the device command
#   tools/gpu_check.sh --prebuilt [--pack-dir .gpu-pack] [--out-dir DIR] [--fail-fast] [--box-scale N]
#        on the GPU machine, with the pack carried there: the check (below); --fail-fast stops at
#        the first failed stage (the others are recorded as not run); --box-scale multiplies every
#        time box and the budget (a slower machine: the rehearsal's CPU stages on 2 cores)
#   tools/gpu_check.sh --rehearse [--pack-dir .gpu-pack] [--break module|data|wheel-lib] [--self-test]
#        on this machine: --pack, then --prebuilt on copies of the pack and the working tree in a
#        scratch folder, in a clean environment (tools/gpu/rehearse.sh); passes when every stage that
#        needs no GPU passes and every GPU stage answers "no GPU". --break removes one thing first,
#        to see the rehearsal fail; --self-test (CI) rehearses, then requires each --break to fail
#   tools/gpu_check.sh [--build-dir build-gpu] [--out-dir DIR]
#        on a GPU machine with every build dependency (GoogleTest, toml++, ...): build, then check
#
# The stages, by value, each in its time box (a stage gets min(box, what is left)); the sanitizers
# last, with whatever time is left, their partial coverage recorded:
#   pack           the binaries' libraries and symbols resolve (ldd -r), glibc, the dataset
#   gpu            nvidia-smi and dtlab's probe see the GPU; driver, CUDA, cuBLAS, cuDNN, NCCL versions
#   op_tests       every op and the executor against the CPU reference (tests/gpu), once, JSON report
#   training_cpu   a short run (cnn, 2 emulated ranks, SyncBN, 10 steps of 64 each) on the CPU
#   training_cuda  the same run on the GPU; its losses beside the CPU's, step by step, and what
#                  its trace's device track says the GPU did (kernels, copies) in the passes
#   eval_cpu/cuda  the GPU-trained weights over the whole test set on both: top-1 agreement
#   cuda_graphs    one rank's cnn run step by step and with --cuda-graphs (--cudnn-deterministic:
#                  cuDNN's default backward adds with atomics): the same weights and losses bit for
#                  bit, and steps replayed from the graph
#   timings_dtlab  dtlab bench train --device cuda: cnn and mlp at batch 32, 64, 256, step by step
#                  and with --cuda-graphs
#   timings_torch  PyTorch eager and CUDA Graph steps on the same GPU (tools/torch/gpu_train_bench.py)
#   nccl           --comm nccl with one rank (NCCL's allreduce, the ring over send/recv); two NCCL
#                  ranks on one GPU refused (exit 9)
#   allreduce      dtlab bench allreduce --device cuda: 2 and 4 emulated ranks' ring on device buffers
#                  (copies device-to-device, adds a kernel) beside a device-to-device copy, 4 KB to 64 MB
#   memcheck       compute-sanitizer memcheck over the op tests
#   racecheck      compute-sanitizer racecheck over the hand-written kernels
# Results: OUT_DIR/gpu_check.json (every stage's status, seconds, figures; rewritten after each
# stage), gpu_check.log (this output) and gpu_check_logs.tar.gz (every command's log). Every stage
# must pass; a test that reports SKIPPED on a GPU machine is a failure (the probe did not see the
# GPU), the two-rank NCCL tests on a one-GPU machine excepted.
# Exit codes: 0 everything passed, 1 a check failed (or no GPU), 2 bad usage or a missing tool.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

MODE=build
PACK=.gpu-pack
BUILD=build-gpu
OUT_DIR=
ARCH="80;90"
BREAK=
SELF_TEST=
EXPECT_NO_GPU=0
FAIL_FAST=0
BOX_SCALE=1
while (($#)); do
  case "$1" in
    --pack) MODE=pack; shift ;;
    --prebuilt) MODE=prebuilt; shift ;;
    --rehearse) MODE=rehearse; shift ;;
    --pack-dir) PACK="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --out-dir) OUT_DIR="$2"; shift 2 ;;
    --arch) ARCH="$2"; shift 2 ;;
    --break) BREAK="$2"; shift 2 ;;
    --self-test) SELF_TEST=--self-test; shift ;;
    --expect-no-gpu) EXPECT_NO_GPU=1; shift ;;  # the rehearsal's verdict: GPU stages must answer "no GPU"
    --fail-fast) FAIL_FAST=1; shift ;;
    --box-scale) BOX_SCALE="$2"; shift 2 ;;  # a slower machine (the rehearsal's): every time box times N
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
say() { echo "gpu_check: $*"; }
fail() { echo "gpu_check: FAILED: $*" >&2; exit 1; }
[[ "$PACK" = /* ]] || PACK="$ROOT/$PACK"

# the device command: what the device's `run` takes (carry, command, timeout)
device_command() {
  local rel=${PACK#"$ROOT"/}
  cat <<EOF
gpu_check: the device command (run it from this repository's checkout; the pack is ignored by git,
gpu_check: so carry names it):
  carry:     ["$rel"]
  timeout_s: 540
  command:   tools/gpu_check.sh --prebuilt --pack-dir $rel --out-dir "\$OUT"
gpu_check: it writes \$OUT/gpu_check.json, gpu_check.log and gpu_check_logs.tar.gz within its 450 s
gpu_check: (an H200 took 80 to 90 s: GPU_CHECK_SECONDS=300 before the command and timeout_s 360 leave a
gpu_check: 15-minute loan room for a run, a fix and several reruns).
EOF
}

case "$MODE" in
  pack)
    tools/gpu/make_pack.sh --pack-dir "$PACK" --arch "$ARCH" || exit 1
    git check-ignore -q "$PACK" 2>/dev/null || say "warning: $PACK is not ignored by git: it would travel as part of the working tree"
    device_command
    exit 0 ;;
  rehearse)
    exec tools/gpu/rehearse.sh --pack-dir "$PACK" --arch "$ARCH" ${BREAK:+--break "$BREAK"} $SELF_TEST ;;
esac

# ---- the check (--prebuilt, or built here) ----
START=$(date +%s)
[[ "$BOX_SCALE" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check: --box-scale takes a whole number >= 1" >&2; exit 2; }
BUDGET=$((${GPU_CHECK_SECONDS:-450} * BOX_SCALE))
DEADLINE=$((START + BUDGET))
left() { echo $((DEADLINE - $(date +%s))); }
if [[ "$MODE" == prebuilt ]]; then
  BIN="$PACK/bin"
  TESTS="$BIN/dtlab_cuda_ops_tests"
  DATA="$PACK/data"
  WORK="$PACK/work"
else
  BIN="$ROOT/$BUILD"
  TESTS="$BIN/tests/gpu/dtlab_cuda_ops_tests"
  DATA=${DTLAB_DATA_DIR:-/usr/share/datasets/fashion-mnist}
  WORK="$ROOT/$BUILD/gpu_check"
fi
DTLAB="$BIN/dtlab"
OUT_DIR=${OUT_DIR:-$WORK/out}
mkdir -p "$OUT_DIR" || { echo "gpu_check: cannot create --out-dir $OUT_DIR" >&2; exit 2; }
OUT_DIR=$(cd "$OUT_DIR" && pwd)
rm -rf "$WORK"
mkdir -p "$WORK"
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1
TEE_PID=$!
for tool in python3 timeout; do command -v $tool >/dev/null || { echo "gpu_check: $tool is missing" >&2; exit 2; }; done
REPORT=(python3 "$ROOT/tools/gpu/report.py")

# The CUDA libraries: PyTorch's wheels (site-packages/nvidia/*/lib: cu13 holds cudart, cuBLAS and
# NVRTC, cudnn and nccl their own), found through the python3 that holds PyTorch; GPU_CHECK_LIB_DIRS
# (folders, colon-separated) instead when set. Built here, the toolkit's folder comes after them.
wheel_lib_dirs() {
  python3 - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = list(sys.path)
try:
    roots += site.getsitepackages() + [site.getusersitepackages()]
except AttributeError:
    pass
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r or ".", "nvidia", "*", "lib"))):
        d = os.path.abspath(d)
        if d not in seen:
            seen.append(d)
print(":".join(seen))
EOF
}
LIBDIRS=${GPU_CHECK_LIB_DIRS:-$(wheel_lib_dirs)}
if [[ "$MODE" == build ]]; then
  [[ -d /usr/local/cuda/lib64 ]] && LIBDIRS="$LIBDIRS${LIBDIRS:+:}/usr/local/cuda/lib64"
fi
export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
say "$(date '+%F %T'); mode $MODE; budget $BUDGET s; binaries $BIN; data $DATA"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
if [[ -n "${GPU_CHECK_LIB_DIRS:-}" ]]; then
  say "CUDA libraries from GPU_CHECK_LIB_DIRS: $GPU_CHECK_LIB_DIRS"
elif [[ -n "$LIBDIRS" ]]; then
  say "CUDA libraries from the nvidia-* wheels python3 sees: $LIBDIRS"
else
  say "no nvidia-* wheel found by python3 ($(command -v python3)): the CUDA libraries must be on LD_LIBRARY_PATH"
fi

MODE_TEXT=$MODE; [[ "$MODE" == build ]] && MODE_TEXT="built here"
init_args=(--out "$OUT_DIR/gpu_check.json" --mode "$MODE_TEXT" --budget "$BUDGET" --data "$DATA")
[[ "$MODE" == prebuilt ]] && init_args+=(--pack "$PACK")
((EXPECT_NO_GPU)) && init_args+=(--expect-no-gpu)
"${REPORT[@]}" init "$WORK" "${init_args[@]}" || exit 2

# stage NAME BOX FUNCTION: runs FUNCTION with STAGE_S = min(BOX, what is left) seconds, then records
# the stage (report.py decides its status from what the commands left in $WORK). FUNCTION appends
# KEY=RC pairs to RCS.
STOPPED=
stage() {
  local name=$1 box=$2 fn=$3 l t0
  l=$(left)
  if [[ -n "$STOPPED" ]]; then
    "${REPORT[@]}" skip "$WORK" "$name" --why "--fail-fast: $STOPPED failed" --quiet
    return
  fi
  if ((l < 3)); then
    "${REPORT[@]}" skip "$WORK" "$name" --why "out of time: the check's $BUDGET s were spent"
    return
  fi
  box=$((box * BOX_SCALE))
  STAGE_S=$((box < l ? box : l))
  RCS=()
  t0=$(date +%s%N)
  $fn
  "${REPORT[@]}" stage "$WORK" "$name" --seconds "$(awk -v n=$(($(date +%s%N) - t0)) 'BEGIN{print n / 1e9}')" \
    --budget "$STAGE_S" "${RCS[@]/#/--rc=}"
  ((FAIL_FAST)) && [[ "$(cat "$WORK/last_status" 2>/dev/null)" == failed ]] && STOPPED=$name
}
# run KEY SECONDS LOG COMMAND...: the command with its own timeout, its exit code recorded as KEY
run() {
  local key=$1 secs=$2 log=$3
  shift 3
  ((secs < 1)) && secs=1
  timeout -k 5 "$secs" "$@" >"$log" 2>&1
  RCS+=("$key=$?")
}
GPU_COUNT=0

# ---- pack (or build) ----
st_pack() {
  if [[ "$MODE" == build ]]; then
    local nvcc cc log="$WORK/build.log"
    nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
    [[ "$cc" =~ ^[0-9]+$ ]] || cc=$ARCH
    if [[ -z "$nvcc" ]]; then
      echo "nvcc not found (PATH, /usr/local/cuda/bin): build a pack elsewhere (--pack) and run --prebuilt here" >"$log"
      RCS+=(build=2)
      return
    fi
    if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDTLAB_WITH_CUDA=ON -DDTLAB_WITH_GUI=OFF \
        -DCMAKE_CUDA_COMPILER="$nvcc" "-DCMAKE_CUDA_ARCHITECTURES=$cc" >"$log" 2>&1; then
      echo "configure failed (a machine without GoogleTest or toml++: --pack elsewhere, then --prebuilt here)" >>"$log"
      RCS+=(build=1)
      return
    fi
    if ! grep -q "GPU backend on" "$log"; then
      echo "the GPU backend is not configured: $(grep 'GPU backend' "$log")" >>"$log"
      RCS+=(build=1)
      return
    fi
    run build "$STAGE_S" "$WORK/build-make.log" cmake --build "$BUILD" -j"$(nproc)" --target dtlab dtlab_cuda_exec dtlab_cuda_ops_tests
    cat "$WORK/build-make.log" >>"$log"
    return
  fi
  if command -v ldd >/dev/null; then
    for f in dtlab dtlab_cuda_ops_tests libdtlab_cuda_exec.so; do
      [[ -e "$BIN/$f" ]] && ldd -r "$BIN/$f" >"$WORK/ldd-$f.txt" 2>&1
    done
    RCS+=(ldd=0)
  else
    RCS+=(ldd=127)
  fi
}
if [[ "$MODE" == build ]]; then stage pack 300 st_pack; else stage pack 30 st_pack; fi

# ---- gpu ----
st_gpu() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader >"$WORK/nvidia-smi.txt" 2>&1
    nvidia-smi -L >"$WORK/nvidia-smi-L.txt" 2>&1
    RCS+=(smi=$?)
  else
    RCS+=(smi=127)
  fi
  run version "$STAGE_S" "$WORK/version.txt" "$DTLAB" version
  local san
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  echo "$san" >"$WORK/sanitizer-path.txt"
}
stage gpu 20 st_gpu
GPU_COUNT=$(grep -c "^GPU " "$WORK/nvidia-smi-L.txt" 2>/dev/null)
GPU_COUNT=${GPU_COUNT:-0}
SANITIZER=$(cat "$WORK/sanitizer-path.txt" 2>/dev/null)

# ---- op_tests: once ----
st_op_tests() {
  run tests "$STAGE_S" "$WORK/tests.log" "$TESTS" --gtest_output="json:$WORK/tests.json"
}
stage op_tests 120 st_op_tests

# ---- training: CPU, then GPU ----
# 10 steps per rank (1280 samples over 2 ranks, batch 64): the CPU side runs the reference sgemm
# (the pack has no OpenBLAS), about 30 s of one core per 1000 samples
RUN_ARGS=(--model cnn --world-size 2 --bn sync --limit-train 1280 --limit-test 500 --batch-size 64
          --data-dir "$DATA" --timeout 60)
st_training_cpu() { run run "$STAGE_S" "$WORK/run-cpu.log" "$DTLAB" run "${RUN_ARGS[@]}" --device cpu --out "$WORK/run-cpu"; }
st_training_cuda() { run run "$STAGE_S" "$WORK/run-cuda.log" "$DTLAB" run "${RUN_ARGS[@]}" --device cuda --out "$WORK/run-cuda"; }
stage training_cpu 90 st_training_cpu
stage training_cuda 60 st_training_cuda

# ---- eval: the GPU-trained weights (else the CPU's) over the whole test set, on both ----
WEIGHTS_RUN="$WORK/run-cuda"
[[ -f "$WEIGHTS_RUN/final.safetensors" ]] || WEIGHTS_RUN="$WORK/run-cpu"
echo "$(basename "$WEIGHTS_RUN")" >"$WORK/eval-weights.txt"
st_eval() { run eval "$STAGE_S" "$WORK/eval-$1.log" "$DTLAB" eval --run "$WEIGHTS_RUN" --limit-test 0 --device "$1" --json "$WORK/eval-$1.json"; }
st_eval_cpu() { st_eval cpu; }
st_eval_cuda() { st_eval cuda; }
stage eval_cpu 60 st_eval_cpu
stage eval_cuda 30 st_eval_cuda

# ---- --cuda-graphs: one rank's run step by step, then with its step captured and replayed ----
st_cuda_graphs() {
  local t0=$(date +%s) key
  for key in eager graphs; do
    run "$key" $((STAGE_S - ($(date +%s) - t0))) "$WORK/run-$key.log" "$DTLAB" run --model cnn --world-size 1 \
      --limit-train 1280 --limit-test 500 --batch-size 64 --data-dir "$DATA" --timeout 60 --device cuda \
      --cudnn-deterministic $([[ $key == graphs ]] && echo --cuda-graphs) --out "$WORK/run-$key"
    [[ "${RCS[-1]}" == *=0 ]] || return
  done
}
stage cuda_graphs 60 st_cuda_graphs

# ---- timings: dtlab's step, then PyTorch's on the same GPU ----
st_timings_dtlab() {
  local t0=$(date +%s) model graphs key
  for model in cnn mlp; do
    for graphs in "" --cuda-graphs; do  # step by step, then the step captured as a CUDA Graph
      key=bench-$model${graphs:+-graphs}
      run "$key" $((STAGE_S - ($(date +%s) - t0))) "$WORK/$key.log" "$DTLAB" bench train --device cuda $graphs \
        --model $model --batch-sizes 32,64,256 --seconds 0.2 --rounds 3 --json "$WORK/$key.json"
      [[ "${RCS[-1]}" == *=0 ]] || return  # no GPU, or broken: the others would say the same
    done
  done
}
st_timings_torch() {
  PYTHONUNBUFFERED=1 run torch "$STAGE_S" "$WORK/torch-bench.log" python3 "$ROOT/tools/torch/gpu_train_bench.py" \
    --batch-sizes 32,64,256 --seconds 0.2 --rounds 3 --json "$WORK/torch-bench.json"
}
stage timings_dtlab 60 st_timings_dtlab
stage timings_torch 90 st_timings_torch

# ---- nccl ----
st_nccl() {
  local t0=$(date +%s) algo
  for algo in nccl ring; do
    run "nccl-$algo" $((STAGE_S - ($(date +%s) - t0))) "$WORK/run-nccl-$algo.log" "$DTLAB" run --model mlp --comm nccl \
      --device cuda --world-size 1 --allreduce $algo --limit-train 2048 --limit-test 1000 --data-dir "$DATA" --timeout 60 \
      --out "$WORK/run-nccl-$algo"
    [[ "${RCS[-1]}" == *=0 ]] || return
  done
  if ((GPU_COUNT == 1)); then
    run two-on-one $((STAGE_S - ($(date +%s) - t0))) "$WORK/run-nccl-two-on-one.log" "$DTLAB" run --model mlp --comm nccl \
      --device cuda --world-size 2 --steps 1 --data-dir "$DATA" --out "$WORK/run-nccl-two-on-one"
  fi
}
stage nccl 45 st_nccl

# ---- the emulated ranks' ring on device buffers, beside a device-to-device copy ----
st_allreduce() {
  run allreduce "$STAGE_S" "$WORK/allreduce.log" "$DTLAB" bench allreduce --device cuda --world-sizes 2,4 \
    --algorithms ring --min-bytes 4096 --max-bytes 67108864 --step-factor 16 --batches 5 --json "$WORK/allreduce.json"
}
stage allreduce 45 st_allreduce

# ---- compute-sanitizer, last: memcheck over every op test, racecheck over the hand-written kernels ----
# (shared-memory races: the block sums of our kernels; cuBLAS's and cuDNN's kernels are not ours, and
# slow under it). API errors are not reported: ours throw DeviceError and fail their test anyway, the
# error-path test makes them on purpose, and the libraries' own handled ones are noise.
st_sanitizer() {  # TOOL FILTER
  local tool=$1 filter=$2
  "$TESTS" --gtest_list_tests --gtest_filter="$filter" >"$WORK/$tool.list" 2>&1
  if [[ -z "$SANITIZER" ]]; then
    echo "compute-sanitizer not found" >"$WORK/$tool.log"
    RCS+=("$tool=127")
    return
  fi
  run "$tool" "$STAGE_S" "$WORK/$tool.log" "$SANITIZER" --tool "$tool" --report-api-errors no --error-exitcode 86 \
    "$TESTS" --gtest_filter="$filter"
}
st_memcheck() { st_sanitizer memcheck "*"; }
st_racecheck() { st_sanitizer racecheck "CudaOps.*-CudaOps.Sgemm*:CudaOps.Convolution*"; }
if ((GPU_COUNT > 0)) || [[ -n "$STOPPED" ]]; then
  stage memcheck $(($(left) * 2 / 3)) st_memcheck
  stage racecheck "$(left)" st_racecheck
else  # recorded as no-gpu (failed where the gpu stage saw a GPU that nvidia-smi did not list)
  "${REPORT[@]}" stage "$WORK" memcheck
  "${REPORT[@]}" stage "$WORK" racecheck
fi

# ---- the results ----
# every log and figure file (the device sends back 8 files of 16 MiB at most): a log over 4 MiB as
# its last MiB (a sanitizer's log full of reports)
( cd "$WORK" && find . -type f -size +4M \( -name '*.log' -o -name '*.txt' \) -exec sh -c 'tail -c 1M "$1" >"$1.tail"' _ {} \; &&
  find . -type f \( -name '*.log' -o -name '*.txt' -o -name '*.json' -o -name '*.jsonl' -o -name '*.list' -o -name '*.tail' \) \
    -size -4M | tar -czf "$OUT_DIR/gpu_check_logs.tar.gz" -T - ) 2>/dev/null
"${REPORT[@]}" verdict "$WORK"
RC=$?
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit $RC
