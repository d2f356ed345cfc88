#!/usr/bin/env bash
# Allreduce of dtlab's emulated ranks (`dtlab bench allreduce`: ring, naive, tree over the
# threads transport) next to Open MPI's MPI_Allreduce (tools/peers/mpi_allreduce_bench.c),
# measured in one run on this machine, interleaved per world size (MPI N, dtlab N, and again for
# each round) so that both see the same machine noise; per size, each side's best time over the
# rounds counts (as tools/bench_train_vs_torch.sh takes best-of-2). Prints per N and size the
# ratios, then the summary against the targets, and a one-line verdict last.
#
#   busbw ratio  = dtlab busbw / MPI busbw (same sizes; busbw = S/t x 2(N-1)/N for both, so this
#                  is MPI time / dtlab time, computed from the times, which carry more digits)
#   time ratio   = MPI time / dtlab time (> 1: dtlab faster), reported for 4-64 KB
#   floor eff    = copy-floor time / best algorithm's time (bench allreduce's eff column)
# Targets: ring busbw ratio over 1-64 MB >= 2 (geometric mean) and >= 1.5 (every size) for each
# N; 4-64 KB time ratio >= 1.0; best algorithm >= 0.8 of the copy floor at 1-64 MB for N <= 4.
#
# --collective reduce_scatter or allgather: `dtlab bench allreduce --collective C` (ring, naive, and
# tree where N is a power of two) next to MPI_Reduce_scatter_block or MPI_Allgather, the same way;
# busbw = S/t x (N-1)/N. No targets yet: per N and size the ratios, per N their geomeans, and last
# the geomean over every N and size of MPI time / dtlab's best time (> 1: dtlab faster).
#
# Usage: tools/bench_allreduce_vs_mpi.sh [--world-sizes 2,4,8] [--min-bytes 4096] [--max-bytes 67108864]
#                                       [--rounds 2] [--collective allreduce|reduce_scatter|allgather]
# Needs: a built dtlab (tools/setup.sh) and Open MPI (installed here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
world_sizes=2,4,8 min_bytes=4096 max_bytes=67108864 rounds=2 collective=allreduce
while (($#)); do
  case "$1" in
    --collective) collective=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --world-sizes) world_sizes=$2; shift 2 ;;
    --min-bytes) min_bytes=$2; shift 2 ;;
    --max-bytes) max_bytes=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case "$collective" in
  allreduce | reduce_scatter | allgather) ;;
  *) echo "--collective: '$collective' must be allreduce, reduce_scatter or allgather" >&2; exit 2 ;;
esac
peer=tools/peers/mpi_allreduce_bench.c
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  echo "# installing Open MPI (openmpi-bin libopenmpi-dev)"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "need root (or sudo) to install openmpi-bin libopenmpi-dev" >&2; exit 2; }
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null
fi
if [[ -d build ]]; then cmake --build build -j"$(nproc)" >/dev/null; else tools/setup.sh >/dev/null; fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -std=c11 "$peer" -o "$tmp/mpi_allreduce_bench"
mpirun_args=(--oversubscribe --bind-to none --timeout 600)
[[ $(id -u) -eq 0 ]] && mpirun_args+=(--allow-run-as-root)

echo "# dtlab bench allreduce vs Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}'), $(nproc) cores, world sizes $world_sizes, $min_bytes..$max_bytes bytes"
echo "# MPI: mpirun ${mpirun_args[*]} -np N mpi_allreduce_bench (out of place); dtlab: in place, threads transport"
echo "# rounds: $rounds (MPI N then dtlab N, per N, each round); per size the best time of each side"
IFS=, read -r -a sizes_n <<<"$world_sizes"
for ((round = 1; round <= rounds; round++)); do
  for n in "${sizes_n[@]}"; do
    # Exit 1: some element was wrong; the #wrong column says how many, and the verdict counts them.
    rc=0
    mpirun "${mpirun_args[@]}" -np "$n" "$tmp/mpi_allreduce_bench" "$min_bytes" "$max_bytes" "$collective" \
      >"$tmp/mpi_${n}_$round.txt" || rc=$?
    ((rc <= 1)) || { echo "mpirun -np $n mpi_allreduce_bench failed (exit $rc)" >&2; exit 2; }
    algos=ring,naive,tree  # the tree's reduce-scatter and allgather need a power-of-two N
    [[ $collective == allreduce || $((n & (n - 1))) -eq 0 ]] || algos=ring,naive
    build/dtlab bench allreduce --collective "$collective" --world-sizes "$n" --algorithms "$algos" \
      --min-bytes "$min_bytes" --max-bytes "$max_bytes" --timeout 600 >"$tmp/lab_${n}_$round.txt"
  done
done
grep -hE '^#   [^ ]' "$tmp/lab_${sizes_n[0]}_1.txt" | sed 's/^#   /# dtlab: /'

if [[ $collective != allreduce ]]; then
  # Per (N, size), each side's best time over the rounds; tree where dtlab ran it ("-" elsewhere).
  for n in "${sizes_n[@]}"; do
    awk -v n="$n" '
      function keep(k, v) { if (!(k in t) || v < t[k]) t[k] = v }
      FILENAME ~ /mpi_/ { if ($1 ~ /^[0-9]+$/) { keep("mpi " $1, $2); bad[$1] += $5; sizes[$1] = 1 } next }
      $1 ~ /^[0-9]+$/ { keep("ring " $1, $5); keep("naive " $1, $9); bad[$1] += $8 + $12; lab[$1] = 1
                        if (NF >= 20) { keep("tree " $1, $13); bad[$1] += $16 } }
      END {
        for (b in sizes) {
          if (!(b in lab)) continue
          tt = -1
          if (("tree " b) in t) tt = t["tree " b]
          print n, b, t["mpi " b], t["ring " b], t["naive " b], tt, bad[b] + 0
        }
      }' "$tmp"/mpi_"${n}"_*.txt "$tmp"/lab_"${n}"_*.txt | sort -k2,2n
  done >"$tmp/joined.txt"
  awk -v coll="$collective" '
    function kb(b) { return b >= 1048576 ? sprintf("%d MB", b / 1048576) : sprintf("%d KB", b / 1024) }
    function r(x) { return x < 0 ? "     -" : sprintf("%6.2f", x) }
    {
      n = $1; b = $2; mt = $3; rt = $4; nt = $5; tt = $6; wrong += $7
      f = (n - 1) / n
      bt = rt; best = "ring"
      if (nt < bt) { bt = nt; best = "naive" }
      if (tt > 0 && tt < bt) { bt = tt; best = "tree" }
      if (n != last) {
        printf "#\n# N = %d      MPI          time ratio MPI/dtlab (> 1: dtlab faster)\n", n
        printf "#   size    time(us) busbw    ring  naive   tree   best\n"
        last = n; ns[++nn] = n
      }
      printf "%8s %10.1f %6.3f  %s %s %s %s %s\n", kb(b), mt, b / mt / 1e3 * f, r(mt / rt), r(mt / nt), (tt > 0 ? r(mt / tt) : r(-1)), r(mt / bt), best
      lr[n] += log(mt / rt); lb[n] += log(mt / bt); c[n]++; all_b += log(mt / bt); all_c++
    }
    END {
      print "#"
      for (i = 1; i <= nn; i++) {
        n = ns[i]
        printf "%s N=%d: MPI time / dtlab time, geomean over %d sizes: ring %.2f, best algorithm %.2f\n", coll, n, c[n], exp(lr[n] / c[n]), exp(lb[n] / c[n])
      }
      printf "#wrong over every dtlab and MPI check: %d\n", wrong
      printf "%s vs Open MPI: geomean MPI time / dtlab best time over every N and size: %.2f%s\n", coll, exp(all_b / all_c), wrong ? " (WRONG ELEMENTS)" : ""
    }' "$tmp/joined.txt"
  exit 0
fi

# One line per (N, size), the best (shortest) time of each side over the rounds: N bytes mpi_us
# mpi_busbw ring_us ring_busbw naive_us naive_busbw tree_us tree_busbw floor_eff best wrong
for n in "${sizes_n[@]}"; do
  awk -v n="$n" '
    function keep(k, v) { if (!(k in t) || v < t[k]) t[k] = v }
    FILENAME ~ /mpi_/ { if ($1 ~ /^[0-9]+$/) { keep("mpi " $1, $2); bad[$1] += $5; sizes[$1] = 1 } next }
    $1 ~ /^[0-9]+$/ { keep("ring " $1, $5); keep("naive " $1, $9); keep("tree " $1, $13); keep("floor " $1, $17)
                      bad[$1] += $8 + $12 + $16; lab[$1] = 1 }
    END {
      f = 2.0 * (n - 1) / n
      for (b in sizes) {
        if (!(b in lab)) continue
        rt = t["ring " b]; nt = t["naive " b]; tt = t["tree " b]; bt = rt; best = "ring"
        if (nt < bt) { bt = nt; best = "naive" }
        if (tt < bt) { bt = tt; best = "tree" }
        print n, b, t["mpi " b], b / t["mpi " b] / 1e3 * f, rt, b / rt / 1e3 * f, nt, b / nt / 1e3 * f, tt,
              b / tt / 1e3 * f, t["floor " b] / bt, best, bad[b] + 0
      }
    }' "$tmp"/mpi_"${n}"_*.txt "$tmp"/lab_"${n}"_*.txt | sort -k2,2n
done >"$tmp/joined.txt"

awk -v lo_small=4096 -v hi_small=65536 -v lo_big=1048576 -v hi_big=67108864 '
  function min(a, b) { return a < b ? a : b }
  function kb(b) { return b >= 1048576 ? sprintf("%d MB", b / 1048576) : sprintf("%d KB", b / 1024) }
  {
    n = $1; b = $2; mt = $3; mb = $4; rt = $5; rb = $6; nt = $7; nb = $8; tt = $9; tb = $10; eff = $11; best = $12
    wrong += $13
    bt = min(rt, min(nt, tt))
    if (n != last) {
      printf "#\n# N = %d        MPI              dtlab busbw (GB/s)          busbw ratio dtlab/MPI      time ratio MPI/dtlab   floor\n", n
      printf "#   size    time(us) busbw    ring   naive    tree     ring   naive    tree  best    ring   best        eff best\n"
      last = n; ns[++nn] = n
    }
    small = b >= lo_small && b <= hi_small
    # busbw ratios from the times (the same S and N on both sides): busbw rounds to 0.000 at 4 KB
    printf "%8s %10.1f %6.3f %7.3f %7.3f %7.3f   %6.2f %6.2f %6.2f %5.2f", kb(b), mt, mb, rb, nb, tb, mt / rt, mt / nt, mt / tt, mt / bt
    if (small) printf "   %6.2f %6.2f", mt / rt, mt / bt; else printf "   %6s %6s", "-", "-"
    printf "   %6.2f %s\n", eff, best
    if (b >= lo_big && b <= hi_big) {
      lr[n] += log(mt / rt); cnt[n]++
      if (!(n in mr) || mt / rt < mr[n]) { mr[n] = mt / rt; mrs[n] = kb(b) }
      if (n <= 4) { if (!have_eff || eff < min_eff) { min_eff = eff; min_eff_at = "N=" n " " kb(b) } have_eff = 1; le += log(eff); ce++ }
      if (n <= 4 && b >= 16777216) { if (!have_eff_big || eff < min_eff_big) min_eff_big = eff; have_eff_big = 1 }
    }
    if (small) {
      if (!have_small || mt / rt < min_small) { min_small = mt / rt; min_small_at = "N=" n " " kb(b) }
      if (!have_small || mt / bt < min_small_best) { min_small_best = mt / bt; min_small_best_at = "N=" n " " kb(b) }
      have_small = 1
    }
  }
  END {
    pass = wrong == 0
    print "#"
    print "# summary (targets: ring busbw ratio geomean >= 2.0 and min >= 1.5 over 1-64 MB for every N;"
    print "#          4-64 KB time ratio >= 1.0; best algorithm >= 0.8 of the copy floor over 1-64 MB, N <= 4)"
    verdict = ""
    for (i = 1; i <= nn; i++) {
      n = ns[i]
      if (!cnt[n]) { printf "ring busbw ratio N=%d: no sizes in 1-64 MB\n", n; continue }
      g = exp(lr[n] / cnt[n]); ok = g >= 2.0 && mr[n] >= 1.5; pass = pass && ok
      printf "ring busbw ratio N=%d, 1-64 MB: geomean %.2f, min %.2f (%s)  %s\n", n, g, mr[n], mrs[n], ok ? "met" : "NOT met"
      verdict = verdict sprintf(" N=%d %.2f (min %.2f)", n, g, mr[n])
    }
    if (have_small) {
      ok_ring = min_small >= 1.0; ok_best = min_small_best >= 1.0; pass = pass && ok_ring
      printf "small messages 4-64 KB, MPI time / dtlab time: ring min %.2f (%s) %s; best algorithm min %.2f (%s) %s\n",
             min_small, min_small_at, ok_ring ? "met" : "NOT met", min_small_best, min_small_best_at, ok_best ? "met" : "NOT met"
    }
    if (have_eff) {
      ok = min_eff >= 0.8; pass = pass && ok
      printf "best algorithm / copy floor, N <= 4, 1-64 MB: min %.2f (%s), geomean %.2f  %s\n", min_eff, min_eff_at, exp(le / ce), ok ? "met" : "NOT met"
      if (have_eff_big)
        printf "  (16-64 MB only, where the copy floor leaves the caches too: min %.2f)\n", min_eff_big
    }
    printf "#wrong over every dtlab and MPI check: %d\n", wrong
    printf "verdict: %s | ring/MPI busbw geomean%s | 4-64 KB MPI/dtlab time min ring %.2f best %.2f | floor eff min %.2f | wrong %d\n",
           pass ? "ALL TARGETS MET" : "TARGETS NOT ALL MET", verdict, min_small, min_small_best, min_eff, wrong
  }' "$tmp/joined.txt"
