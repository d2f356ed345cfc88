#!/usr/bin/env bash
# The GPU backend's checks on a GPU machine, in one command (a few minutes on an H100; budget 8):
#   1. the GPU: nvidia-smi must list one (otherwise exit 1 at once, saying why)
#   2. cuDNN and NCCL: PyTorch's wheels (python3 -c 'import nvidia.cudnn'; nvidia/nccl), else any
#      nvidia/* wheel folder that holds them, else /usr/local/cuda
#   3. build DIR (default build-gpu) with CUDA for this GPU's compute capability, or, with
#      --prebuilt, use DIR as it is (made elsewhere with --pack)
#   4. ctest -L gpu (when built here), then the op tests once more with a JSON report
#   5. compute-sanitizer memcheck over every op test, racecheck over the hand-written kernels
#   6. training through dtlab (when DIR/dtlab exists and the dataset is found: DTLAB_DATA_DIR or
#      the Debian package's folder): the same short run with --device cpu and --device cuda (2
#      emulated ranks on the GPU, SyncBN), their losses side by side; its weights evaluated with
#      --device cpu and cuda (top-1 agreement over the test set); --comm nccl with one rank
#      (--allreduce nccl and ring); on a one-GPU machine, two NCCL ranks refused (exit 9); and bench
#      train --device cuda at batch 32, 64, 256 for both models next to PyTorch's eager and CUDA
#      Graph steps on the same GPU (tools/torch/gpu_train_bench.py, when PyTorch has CUDA)
#   7. gpu_check.json: the GPU, driver, CUDA/cuDNN/NCCL versions, every test's result and time,
#      the sanitizers' verdicts, the convolution algorithms cuDNN chose, the training figures
#
#   tools/gpu_check.sh [--build-dir DIR] [--out FILE] [--prebuilt]
#   tools/gpu_check.sh --pack [--build-dir DIR]   on a machine without a GPU: build DIR for carrying
#        to a GPU machine that lacks the build's dependencies (GoogleTest, toml++, ...): no MPI,
#        no OpenBLAS, no GUI, only the op tests (sm_80 and sm_90); then run --prebuilt there
#
# Every test must pass there: a test that reports SKIPPED on a GPU machine is a failure (the probe
# did not see the GPU). Exit codes: 0 everything passed, 1 a check failed or no GPU, 2 bad usage or
# a missing tool.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

BUILD=build-gpu
OUT=gpu_check.json
PREBUILT=0
PACK=0
while (($#)); do
  case "$1" in
    --build-dir) BUILD="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --prebuilt) PREBUILT=1; shift ;;
    --pack) PACK=1; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_SECONDS:-470}))  # every step gets what is left of 8 minutes
left() { local l=$((DEADLINE - $(date +%s))); echo $((l > 1 ? l : 1)); }
say() { echo "gpu_check: $*"; }
fail() { echo "gpu_check: FAILED: $*" >&2; exit 1; }
TESTS=tests/gpu/dtlab_cuda_ops_tests

# ---- --pack: build here (no GPU needed), carry DIR to the GPU machine ----
if ((PACK)); then
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDTLAB_WITH_CUDA=ON -DDTLAB_WITH_GUI=OFF -DDTLAB_WITH_MPI=OFF \
    -DDTLAB_WITH_BLAS=OFF "-DCMAKE_CUDA_ARCHITECTURES=80;90" >"$BUILD.configure.log" 2>&1 ||
    { tail -20 "$BUILD.configure.log"; fail "configure (log: $BUILD.configure.log)"; }
  grep -q "GPU backend on" "$BUILD.configure.log" || fail "CUDA, cuDNN or NCCL not found: $(grep 'GPU backend' "$BUILD.configure.log")"
  cmake --build "$BUILD" -j"${JOBS:-1}" --target dtlab_cuda_ops_tests dtlab || fail "build"
  say "packed $BUILD/$TESTS ($(du -h "$BUILD/$TESTS" | cut -f1)); on the GPU machine: tools/gpu_check.sh --prebuilt"
  exit 0
fi

# ---- 1. the GPU ----
command -v nvidia-smi >/dev/null || fail "no GPU on this machine: nvidia-smi is not installed (no NVIDIA driver)"
GPU_LINE=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1 | head -1)
if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  fail "no GPU on this machine: nvidia-smi lists none ($GPU_LINE)"
fi
say "GPU: $GPU_LINE"
GPU_COUNT=$(nvidia-smi -L | grep -c "^GPU ")
CC=$(echo "$GPU_LINE" | awk -F', ' '{print $3}' | tr -d '.')
[[ "$CC" =~ ^[0-9]+$ ]] || CC="80;90"
for tool in cmake python3; do command -v $tool >/dev/null || { echo "gpu_check: $tool is missing" >&2; exit 2; }; done
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)

# ---- 2. cuDNN and NCCL ----
# lib_home NAME HEADER LIB: a folder with include/HEADER and lib*/LIB*, from the python module
# nvidia.NAME, then any nvidia/* wheel folder, then /usr/local/cuda
wheel_roots() {
  python3 - <<'EOF' 2>/dev/null
import site, sys, os
for d in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    p = os.path.join(d, "nvidia")
    if os.path.isdir(p):
        print(p)
EOF
}
has() {  # DIR HEADER LIB: DIR/include/HEADER and DIR/lib*/LIB* (or lib/x86_64-linux-gnu)
  [[ -f "$1/include/$2" ]] && { compgen -G "$1/lib*/$3*" >/dev/null || compgen -G "$1/lib/x86_64-linux-gnu/$3*" >/dev/null; }
}
lib_home() {
  local name=$1 header=$2 lib=$3 dir
  dir=$(python3 -c "import nvidia.$name as m; print(list(m.__path__)[0])" 2>/dev/null || true)
  if [[ -n "$dir" ]] && has "$dir" "$header" "$lib"; then echo "$dir"; return; fi
  for root in $(wheel_roots); do
    for dir in "$root"/*; do
      if has "$dir" "$header" "$lib"; then echo "$dir"; return; fi
    done
  done
  for dir in /usr/local/cuda /usr; do
    if has "$dir" "$header" "$lib"; then echo "$dir"; return; fi
  done
}
CUDNN_HOME=$(lib_home cudnn cudnn.h libcudnn.so)
NCCL_HOME=$(lib_home nccl nccl.h libnccl.so)
[[ -n "$CUDNN_HOME" ]] || fail "cuDNN not found (no nvidia.cudnn wheel, nothing under nvidia/*, /usr/local/cuda or /usr)"
[[ -n "$NCCL_HOME" ]] || fail "NCCL not found (no nvidia.nccl wheel, nothing under nvidia/*, /usr/local/cuda or /usr)"
say "cuDNN: $CUDNN_HOME"
say "NCCL: $NCCL_HOME"
# cuDNN's and NCCL's folders first, then the toolkit's (the CUDA runtime and cuBLAS the build was
# made with), then the other nvidia/* wheel folders for what cuDNN loads itself (nvrtc, cublasLt)
LIBDIRS=""
for d in "$CUDNN_HOME"/lib* "$NCCL_HOME"/lib* /usr/local/cuda/lib64 \
         $(for r in $(wheel_roots); do ls -d "$r"/*/lib 2>/dev/null; done); do
  [[ -d "$d" && ":$LIBDIRS:" != *":$d:"* ]] && LIBDIRS="$LIBDIRS${LIBDIRS:+:}$d"
done
export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- 3. build ----
BUILD_MODE="built here"
BUILD_S=0
if ((PREBUILT)); then
  BUILD_MODE="prebuilt"
  [[ -x "$BUILD/$TESTS" ]] || fail "--prebuilt: $BUILD/$TESTS does not exist (make it with tools/gpu_check.sh --pack)"
else
  [[ -n "$NVCC" ]] || { echo "gpu_check: nvcc not found (PATH, /usr/local/cuda/bin); or use --prebuilt" >&2; exit 2; }
  t0=$(date +%s)
  if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDTLAB_WITH_CUDA=ON -DDTLAB_WITH_GUI=OFF \
      -DCMAKE_CUDA_COMPILER="$NVCC" "-DCMAKE_CUDA_ARCHITECTURES=$CC" -DCUDNN_ROOT="$CUDNN_HOME" \
      -DNCCL_ROOT="$NCCL_HOME" >"$BUILD.configure.log" 2>&1; then
    tail -20 "$BUILD.configure.log"
    fail "configure (log: $BUILD.configure.log; a machine without GoogleTest or toml++: build elsewhere with --pack, then --prebuilt)"
  fi
  grep "dtlab: GPU backend" "$BUILD.configure.log"
  grep -q "GPU backend on" "$BUILD.configure.log" || fail "the GPU backend was not configured"
  cmake --build "$BUILD" -j"$(nproc)" --target dtlab_cuda_ops_tests dtlab >"$BUILD.build.log" 2>&1 ||
    { tail -30 "$BUILD.build.log"; fail "build (log: $BUILD.build.log)"; }
  BUILD_S=$(($(date +%s) - t0))
  say "built in ${BUILD_S} s"
fi
if ldd "$BUILD/$TESTS" | grep -q "not found"; then
  ldd "$BUILD/$TESTS" | grep "not found"
  fail "libraries missing for $BUILD/$TESTS (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
fi

# ---- 4. the op tests ----
WORK="$BUILD/gpu_check"
rm -rf "$WORK"
mkdir -p "$WORK"
CTEST_RC=-1
if ((!PREBUILT)); then
  timeout "$(left)" ctest --test-dir "$BUILD" -L gpu --output-on-failure >"$WORK/ctest.log" 2>&1
  CTEST_RC=$?
  tail -4 "$WORK/ctest.log"
fi
t0=$(date +%s)
timeout "$(left)" "$BUILD/$TESTS" --gtest_output="json:$WORK/tests.json" >"$WORK/tests.log" 2>&1
TESTS_RC=$?
TESTS_S=$(($(date +%s) - t0))
grep -E '^# |^\[==========\]|^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test' "$WORK/tests.log"
grep -E '^\[  FAILED  \] [A-Za-z]' "$WORK/tests.log" | sort -u

# ---- 5. compute-sanitizer ----
# memcheck over everything; racecheck (shared-memory races: the block sums of our kernels) over the
# hand-written kernels, leaving cuBLAS and cuDNN's own kernels out (not ours, and slow under it)
# (a step cut by the time budget exits 124 and counts as a failure). API errors are not reported:
# ours throw DeviceError and fail their test anyway, the error-path test makes them on purpose, and
# the libraries' own handled ones are noise.
run_sanitizer() {  # TOOL FILTER SECONDS -> sets SAN_RC, SAN_S; log in $WORK/TOOL.log
  local tool=$1 filter=$2 secs=$3 t
  t=$(date +%s)
  if [[ -z "$SANITIZER" ]]; then
    echo "compute-sanitizer not found" >"$WORK/$tool.log"
    SAN_RC=127
  else
    timeout "$secs" "$SANITIZER" --tool "$tool" --report-api-errors no --error-exitcode 86 "$BUILD/$TESTS" --gtest_filter="$filter" \
      >"$WORK/$tool.log" 2>&1
    SAN_RC=$?
  fi
  SAN_S=$(($(date +%s) - t))
  say "compute-sanitizer $tool: rc $SAN_RC in ${SAN_S} s ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$WORK/$tool.log" | tail -1))"
}
# memcheck gets two thirds of what is left, racecheck the rest
run_sanitizer memcheck "*" $(($(left) * 2 / 3))
MEM_RC=$SAN_RC; MEM_S=$SAN_S
run_sanitizer racecheck "CudaOps.*-CudaOps.Sgemm*:CudaOps.Convolution*" "$(left)"
RACE_RC=$SAN_RC; RACE_S=$SAN_S

# ---- 6. training through dtlab ----
# A step cut by the time budget or failing counts as a failure; no dtlab binary or no dataset is
# recorded as not run (and fails the check: every GPU check must run).
DATA=${DTLAB_DATA_DIR:-/usr/share/datasets/fashion-mnist}
TRAIN_RC=-1
TRAIN_S=0
if [[ -x "$BUILD/dtlab" && -f "$DATA/train-images-idx3-ubyte.gz" ]]; then
  t0=$(date +%s)
  TRAIN_RC=0
  run_args=(--model cnn --world-size 2 --bn sync --limit-train 4096 --limit-test 2000 --batch-size 64
            --data-dir "$DATA" --timeout 60)
  for dev in cpu cuda; do
    timeout "$(left)" "$BUILD/dtlab" run "${run_args[@]}" --device $dev --out "$WORK/run-$dev" \
      >"$WORK/run-$dev.log" 2>&1 || TRAIN_RC=1
  done
  # the GPU-trained weights evaluated on both devices: accuracy and top-1 agreement, sample by sample
  for dev in cpu cuda; do
    timeout "$(left)" "$BUILD/dtlab" eval --run "$WORK/run-cuda" --device $dev --json "$WORK/eval-$dev.json" \
      >"$WORK/eval-$dev.log" 2>&1 || TRAIN_RC=1
  done
  # NCCL with one rank: its own allreduce and the lab's ring over its send/recv; two NCCL ranks on
  # this one GPU refused before NCCL is called (exit 9, saying why)
  for algo in nccl ring; do
    timeout "$(left)" "$BUILD/dtlab" run --model mlp --comm nccl --device cuda --world-size 1 --allreduce $algo \
      --limit-train 2048 --limit-test 1000 --data-dir "$DATA" --timeout 60 --out "$WORK/run-nccl-$algo" \
      >"$WORK/run-nccl-$algo.log" 2>&1 || TRAIN_RC=1
  done
  if ((GPU_COUNT == 1)); then
    timeout "$(left)" "$BUILD/dtlab" run --model mlp --comm nccl --device cuda --world-size 2 --steps 1 \
      --data-dir "$DATA" >"$WORK/run-nccl-two-on-one.log" 2>&1
    rc=$?
    ((rc == 9)) && grep -q "needs 2 GPUs" "$WORK/run-nccl-two-on-one.log" || { TRAIN_RC=1; say "two NCCL ranks on one GPU: rc $rc"; }
  fi
  for model in cnn mlp; do
    timeout "$(left)" "$BUILD/dtlab" bench train --device cuda --model $model --batch-sizes 32,64,256 \
      --seconds 0.2 --rounds 3 --json "$WORK/bench-$model.json" >"$WORK/bench-$model.log" 2>&1 || TRAIN_RC=1
  done
  # PyTorch on the same GPU, the same steps (TF32 off), when it is installed with CUDA
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    timeout "$(left)" python3 tools/torch/gpu_train_bench.py --batch-sizes 32,64,256 --seconds 0.2 --rounds 3 \
      --json "$WORK/torch-bench.json" >"$WORK/torch-bench.log" 2>&1 || TRAIN_RC=1
  else
    say "PyTorch with CUDA not found: no PyTorch timings"
  fi
  TRAIN_S=$(($(date +%s) - t0))
  say "training through dtlab: rc $TRAIN_RC in ${TRAIN_S} s"
else
  say "training through dtlab: not run ($BUILD/dtlab or $DATA/train-images-idx3-ubyte.gz missing)"
fi

# ---- 7. gpu_check.json ----
NVCC_VERSION=$([[ -n "$NVCC" ]] && "$NVCC" --version | grep -o "release [0-9.]*" | cut -d' ' -f2)
python3 - "$OUT" <<EOF
import json, sys, time, re, os
work = "$WORK"
out = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": os.uname().nodename,
       "seconds_total": $(date +%s) - $START}
name, driver, cc, mem = ("$GPU_LINE".split(", ") + [""] * 4)[:4]
out["gpu"] = {"name": name, "driver": driver, "compute_capability": cc, "memory": mem}
lines = [l[2:].strip() for l in open(f"{work}/tests.log") if l.startswith("# ")]
out["backend"] = lines
ver = {"nvcc": "$NVCC_VERSION"}
for key, pat in (("cuda", r"CUDA ([0-9.]+)"), ("cublas", r"cuBLAS ([0-9.]+)"),
                 ("cudnn", r"cuDNN ([0-9.]+(?: \(loaded [0-9.]+\))?)"), ("nccl", r"NCCL ([0-9.]+(?: \(loaded [0-9.]+\))?)")):
    m = re.search(pat, lines[0]) if lines else None
    ver[key] = m.group(1) if m else None
out["versions"] = ver
out["library_dirs"] = {"cudnn": "$CUDNN_HOME", "nccl": "$NCCL_HOME", "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}
out["build"] = {"mode": "$BUILD_MODE", "dir": "$BUILD", "seconds": $BUILD_S}
tests, props = [], {}
try:
    report = json.load(open(f"{work}/tests.json"))
except Exception as e:
    report = {"testsuites": []}
    out["tests_error"] = f"no JSON report ({e}); the op tests exited with {$TESTS_RC}"
std = {"name", "status", "result", "timestamp", "time", "classname", "failures", "file", "line", "value_param", "type_param"}
for suite in report.get("testsuites", []):
    for t in suite.get("testsuite", []):
        full = suite["name"] + "." + t["name"]
        failures = [f.get("failure", "") for f in t.get("failures", [])]
        result = "failed" if failures else ("skipped" if t.get("result") == "SKIPPED" else "passed")
        tests.append({"name": full, "result": result, "seconds": float(t.get("time", "0s").rstrip("s")),
                      **({"failures": failures} if failures else {})})
        extra = {k: v for k, v in t.items() if k not in std}
        if extra:
            props[full] = extra
out["tests"] = tests
out["recorded"] = props
counts = {r: sum(1 for t in tests if t["result"] == r) for r in ("passed", "failed", "skipped")}
out["summary"] = {**counts, "total": len(tests), "exit_code": $TESTS_RC, "seconds": $TESTS_S, "ctest_exit_code": $CTEST_RC}
def san(tool, rc, secs):
    text = open(f"{work}/{tool}.log", errors="replace").read()
    m = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: (\d+) (?:error|hazard)", text)
    return {"exit_code": rc, "seconds": secs, "errors": int(m[-1]) if m else None, "clean": rc == 0,
            "log": f"{work}/{tool}.log"}
out["sanitizers"] = {"memcheck": san("memcheck", $MEM_RC, $MEM_S), "racecheck": san("racecheck", $RACE_RC, $RACE_S)}
def training():
    t = {"exit_code": $TRAIN_RC, "seconds": $TRAIN_S, "ran": $TRAIN_RC != -1}
    for dev in ("cpu", "cuda", "nccl-nccl", "nccl-ring"):
        try:
            sm = json.load(open(f"{work}/run-{dev}/summary.json"))
            t[dev] = {k: sm.get(k) for k in ("test_eval_mode", "test_train_mode", "samples_per_s", "device")}
        except Exception as e:
            t[dev] = {"error": str(e)}
    try:
        ev = {d: json.load(open(f"{work}/eval-{d}.json")) for d in ("cpu", "cuda")}
        a, b = ev["cpu"]["predictions"], ev["cuda"]["predictions"]
        t["eval"] = {"cpu_accuracy": ev["cpu"]["accuracy"], "cuda_accuracy": ev["cuda"]["accuracy"],
                     "top1_agreement": sum(x == y for x, y in zip(a, b)) / max(1, len(a)), "samples": len(a)}
    except Exception as e:
        t["eval"] = {"error": str(e)}
    for model in ("cnn", "mlp"):
        try:
            t[f"bench_{model}"] = json.load(open(f"{work}/bench-{model}.json"))
        except Exception as e:
            t[f"bench_{model}"] = {"error": str(e)}
    # the timing table: dtlab's step against PyTorch eager and with a CUDA Graph, same GPU
    try:
        torch_bench = json.load(open(f"{work}/torch-bench.json"))
        t["torch"] = {k: torch_bench[k] for k in ("torch", "device_name", "cudnn")}
        table = []
        for row in torch_bench["rows"]:
            ours = t.get(f"bench_{row['model']}", {}).get("sweep", [])
            mine = next((r["step_ms"] for r in ours if r["batch_size"] == row["batch_size"]), None)
            best = min(v for v in (row["eager_ms"], row["cuda_graph_ms"], row["compile_ms"]) if v is not None)
            table.append({**row, "dtlab_ms": mine,
                          "dtlab_over_torch_eager": mine / row["eager_ms"] if mine else None,
                          "dtlab_over_torch_best": mine / best if mine else None})
        t["timings"] = table
    except Exception as e:
        t["timings"] = {"error": str(e)}
    return t
out["training"] = training()
ok = counts["failed"] == 0 and counts["skipped"] == 0 and counts["passed"] > 0 and $TESTS_RC == 0 \
     and $MEM_RC == 0 and $RACE_RC == 0 and $CTEST_RC in (-1, 0) and $TRAIN_RC == 0
out["ok"] = ok
json.dump(out, open(sys.argv[1], "w"), indent=2)
print(f"gpu_check: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped; "
      f"memcheck rc {$MEM_RC}, racecheck rc {$RACE_RC}; {out['seconds_total']} s; wrote {sys.argv[1]}")
sys.exit(0 if ok else 1)
EOF
RC=$?
((RC == 0)) || fail "see $OUT and $WORK/*.log"
say "all checks passed"
