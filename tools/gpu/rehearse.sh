#!/usr/bin/env bash
# The GPU check rehearsed on a machine without a GPU (tools/gpu_check.sh --rehearse calls this), so
# that the device's short loan is not spent on a missing library or file:
#   1. builds the pack (tools/gpu/make_pack.sh; --no-build: the pack as it is);
#   2. copies what the device gets into a scratch folder: the working tree as the device's `run`
#      sends it (tracked and untracked-not-ignored files) plus the pack, and a site-packages folder
#      laid out as PyTorch's nvidia-* wheels are (nvidia/cu13/lib, nvidia/cudnn/lib, nvidia/nccl/lib)
#      holding only the libraries those wheels ship, linked from the toolkit's folder;
#   3. runs tools/gpu_check.sh --prebuilt there in a clean environment: env -i, PATH=/usr/bin:/bin,
#      LD_LIBRARY_PATH the pack's bin/ and the wheels' library folders only, PYTHONPATH the wheels'
#      site-packages (the check must find those folders itself, through python3, as on the device
#      where nothing sets LD_LIBRARY_PATH: checked; a CUDA library found elsewhere, e.g. through
#      this machine's ld.so.conf, fails the rehearsal), expecting no GPU: every stage that needs no GPU
#      must pass and every GPU stage answer "no GPU" (its binary started, its libraries loaded,
#      dtlab's probe said no driver), not "missing library" or "configure failed". The time boxes
#      are 4 times the device's (--box-scale 4): the CPU stages run here on 2 cores.
#
#   tools/gpu/rehearse.sh [--pack-dir .gpu-pack] [--arch 90] [--no-build] [--keep]
#                         [--break module|data|wheel-lib] [--self-test]
#   --break      remove one thing before the run (the pack's GPU module, a dataset file, the NCCL
#                wheel's library): the rehearsal must then fail, saying what is missing (it stops at
#                the first failed stage: --fail-fast)
#   --self-test  the rehearsal, then each --break on the same pack, each required to fail with its
#                message (what CI runs: a rehearsal that could not fail would prove nothing)
# The scratch folder is removed after a pass and kept (its path printed) after a failure or --keep.
# Without the CUDA toolkit, cuDNN and NCCL (CUDA_HOME, default /usr/local/cuda) it says SKIPPED and
# exits 0: the pack cannot be built there.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)
PACK=.gpu-pack
ARCH="80;90"
BUILD_PACK=1
KEEP=0
BREAK=
SELF_TEST=0
while (($#)); do
  case "$1" in
    --pack-dir) PACK="$2"; shift 2 ;;
    --arch) ARCH="$2"; shift 2 ;;
    --no-build) BUILD_PACK=0; shift ;;
    --keep) KEEP=1; shift ;;
    --break) BREAK="$2"; shift 2 ;;
    --self-test) SELF_TEST=1; shift ;;
    *) echo "rehearse: unknown argument '$1' (see tools/gpu_check.sh --help)" >&2; exit 2 ;;
  esac
done
case "$BREAK" in ""|module|data|wheel-lib) ;; *) echo "rehearse: --break module, data or wheel-lib (got '$BREAK')" >&2; exit 2 ;; esac
say() { echo "rehearse: $*"; }
fail() { echo "rehearse: FAILED: $*" >&2; exit 1; }
PACK_ABS=$PACK
[[ "$PACK_ABS" = /* ]] || PACK_ABS="$ROOT/$PACK"
PACK_REL=${PACK_ABS#"$ROOT"/}
[[ "$PACK_REL" != /* ]] || fail "--pack-dir must be inside the repository (the device gets the repository and its carried folders)"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CUDA_LIB=$CUDA_HOME/lib64
T0=$(date +%s)

# Without the CUDA toolkit, cuDNN 9 and NCCL here the pack cannot be built: nothing is rehearsed,
# said loudly, and that is not a failure (a CI machine without CUDA builds the CPU build only).
missing=()
[[ -x "$CUDA_HOME/bin/nvcc" ]] || missing+=("$CUDA_HOME/bin/nvcc")
for lib in libcudart.so.13 libcublas.so.13 libcudnn.so.9 libnccl.so.2; do
  [[ -e "$CUDA_LIB/$lib" ]] || missing+=("$CUDA_LIB/$lib")
done
if ((${#missing[@]})); then
  say "SKIPPED: no CUDA 13 toolkit with cuDNN 9 and NCCL here (missing: ${missing[*]}; CUDA_HOME=$CUDA_HOME):"
  say "SKIPPED: the pack cannot be built, so nothing was rehearsed (CUDA 13 with cuDNN 9 and NCCL under /usr/local/cuda, or CUDA_HOME, builds it)"
  exit 0
fi

# What PyTorch's CUDA 13 wheels install (site-packages/nvidia/...), from each wheel's RECORD:
# nvidia-cuda-runtime, nvidia-cublas, nvidia-cuda-nvrtc, nvidia-nvjitlink -> nvidia/cu13/lib;
# nvidia-cudnn-cu13 -> nvidia/cudnn/lib; nvidia-nccl-cu13 -> nvidia/nccl/lib.
WHEELS=(
  "nvidia_cuda_runtime cu13 libcudart.so.13"
  "nvidia_cublas cu13 libcublas.so.13 libcublasLt.so.13 libnvblas.so.13"
  "nvidia_cuda_nvrtc cu13 libnvrtc.so.13 libnvrtc-builtins.so.13.0 libnvrtc.alt.so.13 libnvrtc-builtins.alt.so.13.0"
  "nvidia_nvjitlink cu13 libnvJitLink.so.13"
  "nvidia_cudnn_cu13 cudnn libcudnn.so.9 libcudnn_adv.so.9 libcudnn_cnn.so.9 libcudnn_engines_precompiled.so.9 libcudnn_engines_runtime_compiled.so.9 libcudnn_graph.so.9 libcudnn_heuristic.so.9 libcudnn_ops.so.9"
  "nvidia_nccl_cu13 nccl libnccl.so.2"
)

if ((SELF_TEST)); then
  # the rehearsal must pass, then fail for each thing removed, saying what is missing
  args=(--pack-dir "$PACK" --arch "$ARCH")
  ((BUILD_PACK)) || args+=(--no-build)
  "$0" "${args[@]}" || fail "the rehearsal failed (see above)"
  for b in "module:missing from the pack: bin/libdtlab_cuda_exec.so" "data:t10k-labels-idx1-ubyte.gz missing" \
           "wheel-lib:libnccl.so.2 is not in the CUDA library folders"; do
    what=${b%%:*}
    expect=${b#*:}
    out=$("$0" --pack-dir "$PACK" --arch "$ARCH" --no-build --break "$what" 2>&1)
    rc=$?
    ((rc != 0)) || { echo "$out" | tail -20; fail "--break $what: the rehearsal passed with it missing"; }
    grep -qF -- "$expect" <<<"$out" || { echo "$out" | tail -20; fail "--break $what: it failed, but without saying '$expect'"; }
    say "--break $what: the rehearsal failed as it must ($(($(date +%s) - T0)) s so far):"
    grep -F -- "gpu_check:   " <<<"$out" | head -3 | sed 's/^/    /'
  done
  say "self-test passed in $(($(date +%s) - T0)) s"
  exit 0
fi

if ((BUILD_PACK)); then
  tools/gpu/make_pack.sh --pack-dir "$PACK_ABS" --arch "$ARCH" || fail "the pack could not be built"
fi
[[ -f "$PACK_ABS/manifest.json" ]] || fail "no pack in $PACK_REL (run without --no-build)"

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/gpu-rehearsal.XXXXXX")
REPO="$SCRATCH/repo"
SITE="$SCRATCH/site-packages"
mkdir -p "$REPO" "$SITE" "$SCRATCH/home" "$SCRATCH/out"
# the working tree as the device gets it, then the carried pack
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$REPO" ||
  fail "could not copy the working tree"
mkdir -p "$REPO/$(dirname "$PACK_REL")"
cp -a "$PACK_ABS" "$REPO/$PACK_REL"
rm -rf "$REPO/$PACK_REL/work"
# the wheels' layout; each wheel's RECORD, where the toolkit here was installed from the wheels,
# must list the same libraries (a renamed library would make this rehearsal lie)
for entry in "${WHEELS[@]}"; do
  read -r wheel dir libs <<<"$entry"
  mkdir -p "$SITE/nvidia/$dir/lib"
  for lib in $libs; do
    [[ -e "$CUDA_LIB/$lib" ]] || fail "$CUDA_LIB/$lib is missing: the rehearsal needs the CUDA 13 libraries the wheels ship"
    ln -s "$(readlink -f "$CUDA_LIB/$lib")" "$SITE/nvidia/$dir/lib/$lib"
  done
  record=$(ls "$CUDA_LIB"/../dist-info/"$wheel"-*.dist-info/RECORD 2>/dev/null | head -1)
  if [[ -n "$record" ]]; then
    shipped=$(grep -oE "^nvidia/[^,]*\.so[^,/]*" "$record" | sort | tr '\n' ' ')
    expected=$(for lib in $libs; do echo "nvidia/$dir/lib/$lib"; done | sort | tr '\n' ' ')
    [[ "$shipped" == "$expected" ]] || fail "$wheel ships '$shipped', this script's table says '$expected': update WHEELS"
  fi
done
case "$BREAK" in
  module) rm "$REPO/$PACK_REL/bin/libdtlab_cuda_exec.so"; say "broken on purpose: removed $PACK_REL/bin/libdtlab_cuda_exec.so" ;;
  data) rm "$REPO/$PACK_REL/data/t10k-labels-idx1-ubyte.gz"; say "broken on purpose: removed $PACK_REL/data/t10k-labels-idx1-ubyte.gz" ;;
  wheel-lib) rm "$SITE/nvidia/nccl/lib/libnccl.so.2"; say "broken on purpose: removed the NCCL wheel's libnccl.so.2" ;;
esac
say "scratch $SCRATCH: the working tree ($(du -sh --exclude="$PACK_REL" "$REPO" | cut -f1)), $PACK_REL ($(du -sh "$REPO/$PACK_REL" | cut -f1)), the wheels' site-packages"

WHEEL_DIRS="$SITE/nvidia/cu13/lib:$SITE/nvidia/cudnn/lib:$SITE/nvidia/nccl/lib"
( cd "$REPO" && env -i PATH=/usr/bin:/bin HOME="$SCRATCH/home" LANG=C.UTF-8 PYTHONPATH="$SITE" \
    LD_LIBRARY_PATH="$REPO/$PACK_REL/bin:$WHEEL_DIRS" \
    bash tools/gpu_check.sh --prebuilt --pack-dir "$PACK_REL" --out-dir "$SCRATCH/out" --expect-no-gpu --box-scale 4 ${BREAK:+--fail-fast} )
RC=$?
# the check must have found the wheels' folders itself, through python3, as it must on the device,
# where nothing sets LD_LIBRARY_PATH
found=$(sed -n 's/^gpu_check: CUDA libraries from the nvidia-\* wheels python3 sees: //p' "$SCRATCH/out/gpu_check.log" 2>/dev/null)
if [[ "$found" != "$WHEEL_DIRS" ]]; then
  say "FAILED: the check's own search for the nvidia-* wheels found '$found', expected '$WHEEL_DIRS'"
  RC=1
fi
say "the rehearsal took $(($(date +%s) - T0)) s (pack included); results in $SCRATCH/out"
# kept when the outcome is not the expected one (a pass, or with --break a failure), or with --keep
if ((!KEEP)) && { ((RC == 0)) && [[ -z "$BREAK" ]] || { ((RC != 0)) && [[ -n "$BREAK" ]]; }; }; then
  rm -rf "$SCRATCH"
else
  say "kept $SCRATCH"
fi
exit $RC
