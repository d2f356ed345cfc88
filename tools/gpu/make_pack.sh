#!/usr/bin/env bash
# Builds the GPU pack (tools/gpu_check.sh --pack calls this): what a bare GPU machine needs to run
# tools/gpu_check.sh --prebuilt, built on this machine, which needs no GPU.
#
#   tools/gpu/make_pack.sh [--pack-dir .gpu-pack] [--build-dir build-pack] [--arch "80;90"] [--data DIR]
#                          [--reuse build | --no-reuse]
#
# The pack (PACK, an ignored folder of the repository, carried to the device with `carry`):
#   bin/dtlab, bin/libdtlab_cuda_exec.so (the --device cuda executor, loaded from dtlab's folder),
#   bin/dtlab_cuda_ops_tests, bin/module_imports.txt (the symbols the module takes from dtlab),
#   data/ (Fashion-MNIST: the first 8192 training samples and the whole test set, 7.6 MB),
#   manifest.json (commit, CUDA architectures, the newest glibc symbol version, NEEDED libraries).
# Built with -DDTLAB_PACK=ON (CMakeLists.txt): static libstdc++ and zlib, libgcc_s.so.1 shared, no
# OpenBLAS (statically its kernels for every CPU make 25 MB per binary), MPI, GUI or RPATH.
# Reuse: the object files of an existing build (--reuse, default build/, the one tools/test.sh
# makes) whose target the pack compiles with exactly the same flags (flags.make identical; same
# compilers and build type) are brought up to date there and copied, not compiled again: the core
# (lab/), the CUDA backend, the NCCL transport, a third of the pack's compile time.
# Checked here, failing with the reason:
#   - every NEEDED library is glibc's, libgcc_s.so.1 or one the nvidia-* wheels ship; no RPATH;
#   - no GLIBCXX/CXXABI symbol version (libstdc++ is inside), GCC_ ones no newer than GCC 12's;
#   - glibc symbols no newer than GLIBC_MAX, 2.36: this Debian 12's own (GCC 12's static libstdc++
#     and its unwinder take arc4random, 2.36, and _dl_find_object, 2.35, from it). The device image
#     is assumed to be Ubuntu 24.04's (glibc 2.39), as its Python 3.12.3 is; the check compares the
#     device's own glibc before anything runs there;
#   - dtlab exports no libstdc++ symbol; every symbol the module leaves undefined is exported by
#     dtlab or defined by a library dtlab loads;
#   - the pack and the working tree that travels with it fit the device's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACK=.gpu-pack
BUILD=build-pack
ARCH="80;90"
REUSE=build
DATA=${DTLAB_DATA_DIR:-/usr/share/datasets/fashion-mnist}
TRAIN_SAMPLES=8192
GLIBC_MAX=2.36
CARRY_LIMIT_MIB=64
while (($#)); do
  case "$1" in
    --pack-dir) PACK="$2"; shift 2 ;;
    --build-dir) BUILD="$2"; shift 2 ;;
    --arch) ARCH="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --reuse) REUSE="$2"; shift 2 ;;
    --no-reuse) REUSE=; shift ;;
    *) echo "make_pack: unknown argument '$1' (see tools/gpu_check.sh --help)" >&2; exit 2 ;;
  esac
done
say() { echo "make_pack: $*"; }
fail() { echo "make_pack: FAILED: $*" >&2; exit 1; }
for tool in cmake objdump nm strip python3; do
  command -v $tool >/dev/null || fail "$tool is missing (binutils, cmake and python3 build the pack)"
done
PY=python3
[[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3

# ---- build: only the three targets the pack holds ----
t0=$(date +%s)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$BUILD"
if ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDTLAB_PACK=ON -DDTLAB_WITH_CUDA=ON \
    "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" "${launcher[@]}" >"$BUILD/configure.log" 2>&1; then
  tail -20 "$BUILD/configure.log"
  fail "configure (log: $BUILD/configure.log)"
fi
grep -q "GPU backend on" "$BUILD/configure.log" ||
  fail "the GPU backend is not configured: $(grep 'GPU backend' "$BUILD/configure.log") (CUDA 13, cuDNN 9 and NCCL under /usr/local/cuda, or CUDNN_ROOT / NCCL_ROOT)"

# ---- reuse: the objects of REUSE that the pack would compile with the same flags ----
cache_value() { sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt"; }
reused=0
if [[ -n "$REUSE" && -f "$REUSE/CMakeCache.txt" && -f "$REUSE/Makefile" ]]; then
  same=1
  for key in CMAKE_BUILD_TYPE CMAKE_CXX_COMPILER CMAKE_CUDA_COMPILER CMAKE_CXX_FLAGS CMAKE_CUDA_FLAGS; do
    [[ "$(cache_value "$REUSE" $key)" == "$(cache_value "$BUILD" $key)" ]] || { same=0; say "not reusing $REUSE: its $key differs"; }
  done
  targets=()
  if ((same)); then
    for dir in "$BUILD"/CMakeFiles/*.dir "$BUILD"/tests/gpu/CMakeFiles/*.dir; do
      rel=${dir#"$BUILD"/}
      [[ -f "$dir/flags.make" && -f "$REUSE/$rel/flags.make" ]] || continue
      cmp -s <(grep -v '^#' "$dir/flags.make") <(grep -v '^#' "$REUSE/$rel/flags.make") || continue
      name=$(basename "$rel" .dir)
      [[ "$name" == dtlab_cuda_exec || "$name" == dtlab_nccl_model_tests ]] && continue  # linked, or not in the pack
      targets+=("$name:$rel")
    done
  fi
  if ((${#targets[@]})); then
    # up to date first (a no-op right after tools/test.sh), so that no stale object is copied
    if cmake --build "$REUSE" -j"${JOBS:-$(nproc)}" --target "${targets[@]%%:*}" >"$BUILD/reuse.log" 2>&1; then
      for t in "${targets[@]}"; do
        rel=${t#*:}
        while IFS= read -r -d '' obj; do
          mkdir -p "$BUILD/$(dirname "${obj#"$REUSE"/}")"
          # copied (so newer than the pack's flags.make: make keeps it) unless the pack has the same
          if ! cmp -s "$obj" "$BUILD/${obj#"$REUSE"/}"; then
            cp "$obj" "$BUILD/${obj#"$REUSE"/}"
            [[ -f "$obj.d" ]] && cp "$obj.d" "$BUILD/${obj#"$REUSE"/}.d"
          fi
          reused=$((reused + 1))
        done < <(find "$REUSE/$rel" -name '*.o' -print0)
      done
      say "reused $reused object files of $REUSE (${targets[*]%%:*}): compiled with the same flags"
    else
      say "not reusing $REUSE: bringing it up to date failed ($BUILD/reuse.log)"
    fi
  fi
fi
if ! cmake --build "$BUILD" -j"${JOBS:-$(nproc)}" --target dtlab dtlab_cuda_exec dtlab_cuda_ops_tests >"$BUILD/build.log" 2>&1; then
  grep -E "error|Error" "$BUILD/build.log" | head -20
  fail "build (log: $BUILD/build.log)"
fi
say "built $BUILD in $(($(date +%s) - t0)) s (CUDA architectures $ARCH)"

# ---- assemble ----
rm -rf "$PACK"
mkdir -p "$PACK/bin" "$PACK/data"
cp "$BUILD/dtlab" "$BUILD/libdtlab_cuda_exec.so" "$BUILD/tests/gpu/dtlab_cuda_ops_tests" "$PACK/bin/"
strip "$PACK/bin/dtlab" "$PACK/bin/dtlab_cuda_ops_tests"   # .symtab only: dtlab's exports (.dynsym) stay
strip --strip-unneeded "$PACK/bin/libdtlab_cuda_exec.so"
"$PY" tools/gpu/fashion_subset.py "$DATA" "$PACK/data" --train "$TRAIN_SAMPLES" | sed 's/^/make_pack: /'

# ---- what the binaries need from the machine they run on ----
# glibc's own libraries, libgcc_s.so.1 (one unwinder: CMakeLists.txt, DTLAB_PACK), and the CUDA libraries of PyTorch's wheels (nvidia-cuda-runtime:
# libcudart.so.13; nvidia-cublas: libcublas.so.13, libcublasLt.so.13; nvidia-cudnn-cu13:
# libcudnn.so.9; nvidia-nccl-cu13: libnccl.so.2); the driver's libcuda.so.1 is loaded by cudart
ALLOWED=" libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 ld-linux-x86-64.so.2 libgcc_s.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2 "
needed_json="{"
glibc_max=0
for f in "$PACK"/bin/*; do
  [[ "$f" == *.txt ]] && continue
  name=$(basename "$f")
  needed=$(objdump -p "$f" | awk '/NEEDED/{print $2}')
  for lib in $needed; do
    [[ "$ALLOWED" == *" $lib "* ]] ||
      fail "$name needs $lib, which the GPU machine lacks (only glibc, the driver and the nvidia-* wheels' libraries are there): link it statically under DTLAB_PACK"
  done
  if objdump -p "$f" | grep -qE "R(UN)?PATH"; then fail "$name has an RPATH ($(objdump -p "$f" | grep -E 'R(UN)?PATH')): DTLAB_PACK must set none"; fi
  versions=$(objdump -T "$f" | grep -oE "\b(GLIBCXX|CXXABI)_[0-9.]+" | sort -u | tr '\n' ' ' || true)
  [[ -z "$versions" ]] || fail "$name needs the machine's libstdc++ ($versions): link it statically (-static-libstdc++)"
  gcc_newest=$(objdump -T "$f" | grep -oE "\bGCC_[0-9.]+" | sed 's/GCC_//' | sort -V | tail -1)
  [[ -z "$gcc_newest" || "$(printf '%s\n%s\n' "$gcc_newest" 12.0.0 | sort -V | tail -1)" == 12.0.0 ]] ||
    fail "$name needs libgcc_s GCC_$gcc_newest: newer than GCC 12's"
  newest=$(objdump -T "$f" | grep -oE "GLIBC_[0-9]+\.[0-9]+" | sed 's/GLIBC_//' | sort -V | tail -1)
  [[ -n "$newest" ]] && glibc_max=$(printf '%s\n%s\n' "$glibc_max" "$newest" | sort -V | tail -1)
  needed_json="$needed_json\"$name\": \"$(echo $needed)\", "
done
needed_json="${needed_json%, }}"
[[ "$(printf '%s\n%s\n' "$glibc_max" "$GLIBC_MAX" | sort -V | tail -1)" == "$GLIBC_MAX" ]] ||
  fail "the pack needs glibc $glibc_max, newer than $GLIBC_MAX (what the GPU machine is assumed to have): build it on an older system"
# dtlab exports lab's symbols for the module (ENABLE_EXPORTS) but not libstdc++'s (--exclude-libs):
# cuDNN and NCCL load the machine's libstdc++.so.6 and must not bind to our copy
if nm -D --defined-only "$PACK/bin/dtlab" | grep -qE " (_Znwm|_ZdlPv|__cxa_throw|_ZNSt6thread)$"; then
  fail "dtlab exports libstdc++'s symbols (operator new, __cxa_throw): DTLAB_PACK's --exclude-libs did not apply"
fi
# the symbols the module leaves to the process that loads it: each one exported by dtlab or defined
# by a library dtlab loads (lab's functions; NCCL's, which the module does not link itself). The
# list goes with the pack, so that the device's ldd -r tells them from a symbol its libraries lack.
cuda_path=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
  nm -D --defined-only "$PACK/bin/dtlab"
  for lib in $(LD_LIBRARY_PATH=$cuda_path ldd "$PACK/bin/dtlab" | awk '$3 ~ /^\// {print $3}'); do nm -D --defined-only "$lib"; done
} 2>/dev/null | awk '{sub(/@.*/, "", $NF); print $NF}' | sort -u >"$BUILD/dtlab.exports"
LD_LIBRARY_PATH=$cuda_path ldd -r "$PACK/bin/libdtlab_cuda_exec.so" 2>&1 |
  sed -n 's/^[[:space:]]*undefined symbol: \([^[:space:]]*\).*/\1/p' | sort -u >"$PACK/bin/module_imports.txt"
orphans=$(comm -23 "$PACK/bin/module_imports.txt" "$BUILD/dtlab.exports" | head -5 | tr '\n' ' ')
[[ -z "$orphans" ]] || fail "libdtlab_cuda_exec.so needs symbols that neither dtlab nor the libraries it loads define: $orphans"

# ---- manifest and size ----
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit+uncommitted"
"$PY" - "$PACK" "$commit" "$ARCH" "$glibc_max" "$needed_json" "$TRAIN_SAMPLES" <<'EOF'
import json, os, sys, time
pack, commit, arch, glibc, needed, train = sys.argv[1:]
files = sorted(os.path.relpath(os.path.join(d, f), pack) for d, _, fs in os.walk(pack) for f in fs)
sizes = {f: os.path.getsize(os.path.join(pack, f)) for f in files}
manifest = {"what": "tools/gpu/make_pack.sh: binaries and data for tools/gpu_check.sh --prebuilt",
            "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "cuda_arch": ", ".join(f"sm_{a}" for a in arch.split(";")), "glibc_required": glibc,
            "needed": json.loads(needed), "files": files, "sizes": sizes,
            "data": {"train_samples": int(train), "test_samples": 10000, "source": "Fashion-MNIST"}}
json.dump(manifest, open(os.path.join(pack, "manifest.json"), "w"), indent=2)
EOF
pack_bytes=$(du -sb "$PACK" | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | "$PY" -c '
import os, sys
print(sum(os.lstat(p).st_size for p in sys.stdin.read().split("\0") if p and os.path.lexists(p)))')
total=$((pack_bytes + tree_bytes))
mib() { awk -v b="$1" 'BEGIN{printf "%.1f MiB", b / 1048576}'; }
say "pack $PACK: $(mib "$pack_bytes") (bin $(du -sh "$PACK/bin" | cut -f1), data $(du -sh "$PACK/data" | cut -f1)); the working tree that travels with it: $(mib "$tree_bytes"); together $(mib $total) of $CARRY_LIMIT_MIB MiB"
((total < CARRY_LIMIT_MIB * 1048576)) || fail "the pack and the working tree exceed the device's $CARRY_LIMIT_MIB MiB"
say "glibc symbols up to $glibc_max; NEEDED: $(echo "$needed_json" | tr -d '{}"')"
