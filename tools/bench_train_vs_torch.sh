#!/usr/bin/env bash
# Training throughput of dtlab next to PyTorch (../shared/peers/torch_peer.py), measured in one
# run on this machine, interleaved (torch, dtlab, torch, dtlab) and best-of-2 for each, so that
# both see the same machine noise. The last line is `lab/torch <ratio>`.
#
# Usage: tools/bench_train_vs_torch.sh [--model cnn] [--batch-size 64] [--threads 1] [--world-size 1]
# Needs: a built dtlab (tools/setup.sh) and Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
model=cnn batch=64 threads=1 world=1
while (($#)); do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --world-size) world=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
peer=${DTLAB_PEERS_DIR:-../shared/peers}/torch_peer.py
[[ -f "$peer" ]] || { echo "PyTorch peer not found at $peer (set DTLAB_PEERS_DIR)" >&2; exit 2; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "python3-torch is not installed: apt-get install python3-torch" >&2; exit 2; }
[[ -x build/dtlab ]] || tools/setup.sh

# Debian's OpenBLAS misdetects recent CPUs; give both programs the right kernel (dtlab would
# choose the same by itself).
if [[ -z "${OPENBLAS_CORETYPE:-}" ]]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
export OPENBLAS_NUM_THREADS=$threads
echo "# model=$model batch_size=$batch threads=$threads world_size=$world OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} $(nproc) cores"

torch_args=(--model "$model" --batch-size "$batch" --threads "$threads")
((world > 1)) && torch_args+=(--world-size "$world")
best_torch=0 best_lab=0
for round in 1 2; do
  t=$(/usr/bin/python3 "$peer" "${torch_args[@]}" | awk '/^samples_per_s/ {print $2}')
  l=$(build/dtlab bench train --model "$model" --batch-size "$batch" --threads "$threads" --world-size "$world" |
      awk '/^samples_per_s/ {print $2}')
  echo "round $round: torch $t samples/s, dtlab $l samples/s"
  best_torch=$(awk -v a="$best_torch" -v b="$t" 'BEGIN {print (b > a ? b : a)}')
  best_lab=$(awk -v a="$best_lab" -v b="$l" 'BEGIN {print (b > a ? b : a)}')
done
echo "torch $best_torch samples/s (best of 2)"
echo "dtlab $best_lab samples/s (best of 2)"
awk -v l="$best_lab" -v t="$best_torch" 'BEGIN {printf "lab/torch %.2f\n", l / t}'
