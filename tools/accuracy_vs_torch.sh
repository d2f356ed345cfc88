#!/usr/bin/env bash
# Test accuracy on the full Fashion-MNIST with the documented settings: dtlab with 1 rank (global
# batch 128), dtlab with 4 ranks and SyncBatchNorm (per-rank batch 32, the same global batch), and
# PyTorch with the same model, initial weights, data order and schedule
# (tools/torch/accuracy_reference.py: one process on the global batch, which is what 4 ranks with
# SyncBatchNorm compute). Prints each run's final test accuracy in eval mode, the targets, and last
# the largest distance between dtlab and PyTorch in points.
#
# Usage: tools/accuracy_vs_torch.sh [cnn|mlp ...]     (default: both; the cnn takes the longest)
# Settings (the README's): --epochs 15 --lr 0.05 --momentum 0.9 --weight-decay 5e-4
#                          --lr-schedule cosine --seed 0
# Needs: a built dtlab (tools/setup.sh), the dataset, and Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
models=("$@")
((${#models[@]})) || models=(cnn mlp)
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "python3-torch is not installed: apt-get install python3-torch" >&2; exit 2; }
[[ -x build/dtlab ]] || tools/setup.sh >/dev/null
if [[ -z "${OPENBLAS_CORETYPE:-}" ]]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
settings=(--epochs 15 --lr 0.05 --momentum 0.9 --weight-decay 5e-4 --lr-schedule cosine --seed 0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "# dtlab vs PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'): ${settings[*]}, $(nproc) cores"
worst=0
for m in "${models[@]}"; do
  case "$m" in cnn) target=0.92 ;; mlp) target=0.885 ;; *) echo "unknown model: $m" >&2; exit 2 ;; esac
  t0=$SECONDS
  build/dtlab run --model "$m" --world-size 1 --batch-size 128 "${settings[@]}" --out "$tmp/$m-1" >"$tmp/$m-1.log" 2>&1 ||
    { cat "$tmp/$m-1.log" >&2; exit 1; }
  one=$(python3 -c "import json; print(json.load(open('$tmp/$m-1/summary.json'))['test_eval_mode']['accuracy'])")
  t1=$SECONDS
  build/dtlab run --model "$m" --world-size 4 --batch-size 32 --bn sync "${settings[@]}" --out "$tmp/$m-4" \
    >"$tmp/$m-4.log" 2>&1 || { cat "$tmp/$m-4.log" >&2; exit 1; }
  four=$(python3 -c "import json; print(json.load(open('$tmp/$m-4/summary.json'))['test_eval_mode']['accuracy'])")
  t2=$SECONDS
  ref=$(OPENBLAS_NUM_THREADS=$(nproc) /usr/bin/python3 tools/torch/accuracy_reference.py --model "$m" --batch-size 128 \
          --threads "$(nproc)" "${settings[@]}" | tee "$tmp/$m-torch.log" | awk '/^test_accuracy/ {print $2}')
  t3=$SECONDS
  awk -v m="$m" -v one="$one" -v four="$four" -v ref="$ref" -v target="$target" \
      -v s1=$((t1 - t0)) -v s4=$((t2 - t1)) -v st=$((t3 - t2)) 'BEGIN {
    d1 = (one - ref) * 100; d4 = (four - ref) * 100
    printf "%s: dtlab 1 rank (batch 128) %.4f (%d s) | dtlab 4 ranks SyncBN (batch 32 each) %.4f (%d s) | PyTorch %.4f (%d s)\n",
           m, one, s1, four, s4, ref, st
    printf "%s: target >= %.3f: %s; |dtlab - PyTorch| %.2f and %.2f points (within 0.5: %s)\n", m, target,
           (one >= target && four >= target) ? "met" : "NOT met", (d1 < 0 ? -d1 : d1), (d4 < 0 ? -d4 : d4),
           ((d1 < 0 ? -d1 : d1) <= 0.5 && (d4 < 0 ? -d4 : d4) <= 0.5) ? "yes" : "NO" }'
  worst=$(awk -v w="$worst" -v a="$one" -v b="$four" -v r="$ref" 'BEGIN {
    x = (a - r) * 100; if (x < 0) x = -x; y = (b - r) * 100; if (y < 0) y = -y
    if (y > x) x = y; print (x > w ? x : w) }')
done
echo "max |dtlab - PyTorch| points $worst"
