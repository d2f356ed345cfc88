// NCCL's cost model (lab/sim/nccl_model.h), NCCL v2.30.7-1. Every expected figure is worked by hand
// below from src/graph/tuning.cc's constants and formulas:
//   baseLat {LL, LL128, Simple}: tree {6.8, 14.0, 8.4}, ring {6.6, 14.0, 8.4}
//   hop NVLink: tree {0.6, 1.25, 4.0}, ring {0.6, 1.9, 3.4}; PCI: tree {1.0, 1.9, 4.0}, ring {1.0, 2.5, 5.7}
//   hop NET:    tree {5.0, 8.5, 14},   ring {2.7, 4.0, 14.0}
//   ring (not broadcast): lat = base + (nsteps - nInter) * max(intra, netOverhead) + nInter * inter,
//     nsteps = 2(n-1) allreduce, n-1 allgather/reducescatter; nInter = 2(N-1) / N-1 (N nodes);
//     netOverhead (N > 1, Intel) = 1.0 us, x3 for Simple.
//   tree allreduce: lat = base + 2 * ((ppn-1) * intra + floor(log2 N) * inter)
//   bus bw = 370 (bwIntra x channels) when N <= 2, 388 (bwInter x channels) when N > 2;
//   algbw: ring x n/nsteps, tree x 0.5; time = lat + bytes / (1000 * algbw)  [us, GB/s].
// Defaults: Hopper (sm90), 8 GPUs per node, 16 channels (32 after connect.cc's doubling), NVLink,
// Intel CPU, 370 / 388 GB/s.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "errors.h"
#include "nccl_model.h"

namespace {

lab::NcclModelInputs hopper(int gpus) {
  lab::NcclModelInputs in;
  in.gpus_per_node = 8;
  in.nodes = gpus / 8;
  return in;
}

const lab::NcclTuned& entry(const std::vector<lab::NcclTuned>& t, lab::NcclAlgo a, lab::NcclProto p) {
  for (const auto& e : t)
    if (e.algo == a && e.proto == p) return e;
  throw std::logic_error("missing entry");
}

const lab::NcclEstimate& entry(const std::vector<lab::NcclEstimate>& t, lab::NcclAlgo a, lab::NcclProto p) {
  for (const auto& e : t)
    if (e.algo == a && e.proto == p) return e;
  throw std::logic_error("missing entry");
}

using lab::NcclAlgo;
using lab::NcclColl;
using lab::NcclProto;

}  // namespace

TEST(NcclModelNames, NamesAndSourceOrder) {
  EXPECT_STREQ(lab::nccl_algo_name(NcclAlgo::Tree), "tree");
  EXPECT_STREQ(lab::nccl_algo_name(NcclAlgo::Ring), "ring");
  EXPECT_STREQ(lab::nccl_proto_name(NcclProto::LL), "LL");
  EXPECT_STREQ(lab::nccl_proto_name(NcclProto::LL128), "LL128");
  EXPECT_STREQ(lab::nccl_proto_name(NcclProto::Simple), "Simple");
  const auto est = lab::nccl_estimates(hopper(16), NcclColl::AllReduce, 1 << 20);
  ASSERT_EQ(est.size(), 6u);
  const NcclAlgo algos[] = {NcclAlgo::Tree, NcclAlgo::Tree, NcclAlgo::Tree, NcclAlgo::Ring, NcclAlgo::Ring, NcclAlgo::Ring};
  const NcclProto protos[] = {NcclProto::LL, NcclProto::LL128, NcclProto::Simple, NcclProto::LL, NcclProto::LL128, NcclProto::Simple};
  for (int i = 0; i < 6; i++) {
    EXPECT_EQ(est[i].algo, algos[i]);
    EXPECT_EQ(est[i].proto, protos[i]);
    EXPECT_TRUE(est[i].enabled);
  }
}

// Ring allreduce, Simple, table latency (before the plateau factor):
//   16 GPUs (N=2):   nsteps 30, nInter 2:    8.4 + 28*3.4 + 2*14 = 8.4 + 95.2 + 28 = 131.6 us   -> "132 us"
//   64 (N=8):        126, 14:   8.4 + 112*3.4 + 14*14 = 8.4 + 380.8 + 196 = 585.2 us          -> "585"
//   256 (N=32):      510, 62:   8.4 + 448*3.4 + 62*14 = 8.4 + 1523.2 + 868 = 2399.6 us        -> "2.4 ms"
//   1024 (N=128):    2046, 254: 8.4 + 1792*3.4 + 254*14 = 8.4 + 6092.8 + 3556 = 9657.2 us     -> "9.7 ms"
//   4096 (N=512):    8190, 1022: 8.4 + 7168*3.4 + 1022*14 = 8.4 + 24371.2 + 14308 = 38687.6 us -> "38.7 ms"
// (the intra-node hop stays 3.4: max(3.4, 3 x 1.0 net overhead) = 3.4.)
TEST(NcclModelLatency, RingAllReduceSimpleSummaryFigures) {
  struct Case { int gpus; double exact; double summary; double rounding; };
  const Case cases[] = {{16, 131.6, 132, 0.5}, {64, 585.2, 585, 0.5}, {256, 2399.6, 2400, 50},
                        {1024, 9657.2, 9700, 50}, {4096, 38687.6, 38700, 50}};
  for (const Case& c : cases) {
    const auto t = lab::nccl_tune_model(hopper(c.gpus), NcclColl::AllReduce);
    const double lat = entry(t, NcclAlgo::Ring, NcclProto::Simple).latency_us;
    EXPECT_NEAR(lat, c.exact, 1e-6 * c.exact) << c.gpus << " GPUs";
    EXPECT_NEAR(lat, c.summary, c.rounding) << c.gpus << " GPUs";
  }
}

// Tree allreduce, Simple: 8.4 + 2 * (7*4.0 + log2(N)*14) = 8.4 + 56 + 28*log2(N):
//   N=2: 92.4 ("92"), N=8: 148.4 ("148"), N=32: 204.4 ("204"), N=128: 260.4 ("260"), N=512: 316.4 ("316").
TEST(NcclModelLatency, TreeAllReduceSimpleSummaryFigures) {
  struct Case { int gpus; double exact; double summary; };
  const Case cases[] = {{16, 92.4, 92}, {64, 148.4, 148}, {256, 204.4, 204}, {1024, 260.4, 260}, {4096, 316.4, 316}};
  for (const Case& c : cases) {
    const auto t = lab::nccl_tune_model(hopper(c.gpus), NcclColl::AllReduce);
    const double lat = entry(t, NcclAlgo::Tree, NcclProto::Simple).latency_us;
    EXPECT_NEAR(lat, c.exact, 1e-6 * c.exact) << c.gpus << " GPUs";
    EXPECT_NEAR(lat, c.summary, 0.5) << c.gpus << " GPUs";
  }
}

// The other protocols at 16 GPUs (N=2, ppn 8):
//   ring LL:    6.6 + 28*max(0.6, 1.0) + 2*2.7 = 6.6 + 28 + 5.4 = 40.0
//   ring LL128: 14 + 28*max(1.9, 1.0) + 2*4.0 = 14 + 53.2 + 8 = 75.2
//   tree LL:    6.8 + 2*(7*0.6 + 1*5.0) = 6.8 + 18.4 = 25.2
//   tree LL128: 14 + 2*(7*1.25 + 1*8.5) = 14 + 34.5 = 48.5
// Bandwidths (bus 370, N2 column, Hopper, Intel => llMaxBw = llMaxBws[0][1] = 39):
//   ring Simple 370 * 16/30 = 197.333;  ring LL128 min(370*.92 = 340.4, 16*36.7 = 587.2) * 16/30 = 181.547
//   ring LL     min(39, 185) * 16/30 = 20.8
//   tree Simple min(340.4, 16*41.4 = 662.4) * .5 = 170.2
//   tree LL128  min(340.4 * 120/128 = 319.125, 16*36.7 = 587.2) * .5 = 159.5625
//   tree LL     min(340.4 / 3.8 = 89.58, 39) * .5 = 19.5
TEST(NcclModelLatency, AllProtocolsTwoNodes) {
  const auto t = lab::nccl_tune_model(hopper(16), NcclColl::AllReduce);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::LL).latency_us, 40.0, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::LL128).latency_us, 75.2, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::LL).latency_us, 25.2, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::LL128).latency_us, 48.5, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::Simple).bandwidth_GBps, 370.0 * 16 / 30, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::LL128).bandwidth_GBps, 340.4 * 16 / 30, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::LL).bandwidth_GBps, 20.8, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::Simple).bandwidth_GBps, 170.2, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::LL128).bandwidth_GBps, 159.5625, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::LL).bandwidth_GBps, 19.5, 1e-9);
}

// The ring plateau: ring/Simple allreduce latency x1.4 (sm80+) across nodes once
// bytes / (comm channels 32 * 16 ranks) >= 64, i.e. from 32 KiB at 16 GPUs:
//   16 KiB: 16384/512 = 32 < 64 -> 131.6;  32 KiB: 32768/512 = 64 -> 131.6 * 1.4 = 184.24.
// Ampere keeps 1.4; Volta (sm70) has 1.9: 131.6 * 1.9 = 250.04 (Volta's caps don't touch latency).
// One node never gets it.
TEST(NcclModelLatency, RingPlateauFactor) {
  const auto in = hopper(16);
  EXPECT_NEAR(entry(lab::nccl_estimates(in, NcclColl::AllReduce, 16384), NcclAlgo::Ring, NcclProto::Simple).latency_us, 131.6, 1e-9);
  EXPECT_NEAR(entry(lab::nccl_estimates(in, NcclColl::AllReduce, 32768), NcclAlgo::Ring, NcclProto::Simple).latency_us, 184.24, 1e-9);
  auto volta = in;
  volta.cuda_arch = 700;
  EXPECT_NEAR(entry(lab::nccl_estimates(volta, NcclColl::AllReduce, 1 << 30), NcclAlgo::Ring, NcclProto::Simple).latency_us, 250.04, 1e-9);
  // Not for all-gather: 2 nodes, nsteps 15, nInter 1: 8.4 + 14*3.4 + 14 = 70.0 at any size.
  EXPECT_NEAR(entry(lab::nccl_estimates(in, NcclColl::AllGather, 1 << 30), NcclAlgo::Ring, NcclProto::Simple).latency_us, 70.0, 1e-9);
}

// Power-of-two crossover (all protocols). Tree correction factors by log2(bytes/64) apply below 512 MiB.
//  16 GPUs: 2^24 (idx 18, LL128 factor .9): tree LL128 48.5 + 16777216/(159.5625*.9*1000 = 143606.25) = 165.33
//           vs ring LL128 75.2 + 16777216/181546.7 = 167.61 (ring Simple 184.24 + 85.02 = 269.26): tree.
//           2^25 (idx 19, .9): tree LL128 48.5 + 233.66 = 282.16 vs ring LL128 75.2 + 184.83 = 260.03: ring.
//  64 GPUs (N=8, bus 388; tree Simple 178.48 = min(388*.92, 16*36.0) * .5; ring Simple 388*64/126 = 197.079,
//           lat 585.2*1.4 = 819.28; ring LL128 282.8 = 14 + 112*1.9 + 14*4.0, 356.96*64/126 = 181.313):
//           2^30 (no factor): tree Simple 148.4 + 1073741824/178480 = 6164.4; ring LL128 282.8 + 5922.0 = 6204.8;
//           ring Simple 819.28 + 5448.3 = 6267.6: tree.  2^31: tree 148.4 + 12032.1 = 12180.5; ring Simple
//           819.28 + 10896.5 = 11715.8: ring.
//  256 (N=32): ring Simple 2399.6*1.4 = 3359.44, 388*256/510 = 194.761; ring LL128 1113.2, 179.180:
//           2^32: tree Simple 204.4 + 24064.1 = 24268.5 < ring LL128 1113.2 + 23970.1 = 25083.3: tree.
//           2^33: tree 204.4 + 48128.3 = 48332.7 > ring Simple 3359.44 + 44105.0 = 47464.5: ring.
//  1024 (N=128): ring Simple 9657.2*1.4 = 13520.08, 388*1024/2046 = 194.190; ring LL128 4434.8, 178.655:
//           2^34: tree Simple 260.4 + 96256.5 = 96517.0 < ring LL128 4434.8 + 96162.6 = 100597.4: tree.
//           2^35: tree 260.4 + 192513.1 = 192773.5 > ring Simple 13520.08 + 176939.1 = 190459.2: ring.
//  4096 (N=512): ring Simple 38687.6*1.4 = 54162.64, 388*4096/8190 = 194.047:
//           2^36: tree 316.4 + 385026.2 = 385342.6 < ring Simple 54162.64 + 354137.6 = 408300.3 (LL128 402653.4): tree.
//           2^37: tree 316.4 + 770052.4 = 770368.8 > ring Simple 54162.64 + 708275.3 = 762437.9: ring.
TEST(NcclModelCrossover, PowerOfTwoBins) {
  struct Case { int gpus; int log2_bytes; };
  const Case cases[] = {{16, 25}, {64, 31}, {256, 33}, {1024, 35}, {4096, 37}};
  for (const Case& c : cases) {
    const auto in = hopper(c.gpus);
    EXPECT_EQ(lab::nccl_ring_tree_crossover(in), std::ldexp(1.0, c.log2_bytes)) << c.gpus << " GPUs";
    EXPECT_EQ(lab::nccl_choice(in, NcclColl::AllReduce, std::ldexp(1.0, c.log2_bytes - 1)).algo, NcclAlgo::Tree);
    EXPECT_EQ(lab::nccl_choice(in, NcclColl::AllReduce, std::ldexp(1.0, c.log2_bytes)).algo, NcclAlgo::Ring);
  }
  // The deciding pairs at 16 GPUs.
  const auto in = hopper(16);
  const auto below = lab::nccl_choice(in, NcclColl::AllReduce, 16777216);
  EXPECT_EQ(below.proto, NcclProto::LL128);
  EXPECT_NEAR(below.time_us, 48.5 + 16777216 / 143606.25, 1e-6);
  const auto above = lab::nccl_choice(in, NcclColl::AllReduce, 33554432);
  EXPECT_EQ(above.proto, NcclProto::LL128);
  EXPECT_NEAR(above.time_us, 75.2 + 33554432 / (340.4 * 16 / 30 * 1000), 1e-6);
}

// The summary's "about 28 MB (16 GPUs) to about 28 GB (1,024 GPUs)" is the continuous crossover with
// Simple only (NCCL_PROTO=Simple):
//   16 GPUs: near 27.6 MB, idx floor(log2(27.6e6/64)) = 18, Simple factor .7: tree 170.2*.7 = 119.14 GB/s.
//     92.4 + x/119140 = 184.24 + x/197333  =>  x = 91.84 / (1/119140 - 1/197333) = 91.84 / 3.3259e-6 = 27.61e6 B.
//   1024 GPUs: no factor above 512 MiB:  260.4 + x/178480 = 13520.08 + x/194189.6
//     => x = 13259.68 / (1/178480 - 1/194189.6) = 13259.68 / 4.5326e-10 = 29.25e9 B (27.2 GiB).
TEST(NcclModelCrossover, SimpleOnlyContinuousCrossover) {
  auto in = hopper(16);
  in.proto_allowed[0] = in.proto_allowed[1] = false;
  EXPECT_EQ(lab::nccl_choice(in, NcclColl::AllReduce, 27.5e6).algo, NcclAlgo::Tree);
  EXPECT_EQ(lab::nccl_choice(in, NcclColl::AllReduce, 27.7e6).algo, NcclAlgo::Ring);
  EXPECT_EQ(lab::nccl_ring_tree_crossover(in), std::ldexp(1.0, 25));  // 27.6 MB lies in (2^24, 2^25]
  auto big = hopper(1024);
  big.proto_allowed[0] = big.proto_allowed[1] = false;
  EXPECT_EQ(lab::nccl_choice(big, NcclColl::AllReduce, 29.2e9).algo, NcclAlgo::Tree);
  EXPECT_EQ(lab::nccl_choice(big, NcclColl::AllReduce, 29.3e9).algo, NcclAlgo::Ring);
}

// Ring-only collectives at 16 MB (NCCL's nBytes: the gathered output for all-gather, the input for
// reduce-scatter; 16 MB = 16e6 bytes; 16 MiB in brackets). Effective algbw = bytes / time.
//  16 GPUs (N=2, nsteps 15, nInter 1, bus 370):
//    LL128:  14 + 14*1.9 + 1*4.0 = 44.6 us; min(340.4, 587.2) * 16/15 = 363.093 GB/s;
//            44.6 + 16e6/363093.3 = 44.6 + 44.066 = 88.666 us -> 180.45 GB/s  [16 MiB: 90.806 us, 184.76 GB/s]
//    Simple: 8.4 + 14*3.4 + 14 = 70.0; 370*16/15 = 394.667; 70 + 40.541 = 110.54 us (slower)
//    LL:     6.6 + 14*1.0 + 2.7 = 23.3; 39*16/15 = 41.6; 23.3 + 384.6 = 407.9 us (slower)
//  1024 GPUs (N=128, nsteps 1023, nInter 127, bus 388, llMaxBw Intel-N4 = 20.4):
//    LL:     6.6 + 896*1.0 + 127*2.7 = 1245.5 us; min(20.4, 194) * 1024/1023 = 20.41994 GB/s;
//            1245.5 + 16e6/20419.94 = 1245.5 + 783.55 = 2029.05 us -> 7.885 GB/s  [16 MiB: 2067.11 us, 8.116 GB/s]
//    LL128:  14 + 896*1.9 + 127*4.0 = 2224.4; 356.96*1024/1023 = 357.309; 2224.4 + 44.78 = 2269.18 (slower)
//    Simple: 8.4 + 896*3.4 + 127*14 = 4832.8 (slower)
// The summary's 188 GB/s at 16 GPUs is not what the source gives (180.5): it matches LL128's latency
// with LL128's 0.92 factor left out: 44.6 + 16e6/394667 = 85.14 us -> 187.9 GB/s.
TEST(NcclModelRingOnly, AllGatherReduceScatter16MB) {
  for (NcclColl coll : {NcclColl::AllGather, NcclColl::ReduceScatter}) {
    const auto small = lab::nccl_choice(hopper(16), coll, 16e6);
    EXPECT_EQ(small.algo, NcclAlgo::Ring);
    EXPECT_EQ(small.proto, NcclProto::LL128);
    EXPECT_NEAR(small.time_us, 88.666, 1e-3);
    EXPECT_NEAR(16e6 / small.time_us / 1e3, 180.45, 0.01);
    const auto mib = lab::nccl_choice(hopper(16), coll, 16777216);
    EXPECT_NEAR(16777216 / mib.time_us / 1e3, 184.76, 0.01);

    const auto large = lab::nccl_choice(hopper(1024), coll, 16e6);
    EXPECT_EQ(large.algo, NcclAlgo::Ring);
    EXPECT_EQ(large.proto, NcclProto::LL);
    EXPECT_NEAR(large.time_us, 2029.05, 0.01);
    EXPECT_NEAR(16e6 / large.time_us / 1e3, 7.885, 0.001);
    EXPECT_NEAR(16e6 / large.time_us / 1e3, 8, 0.5);  // the summary's "about 8 GB/s"

    // No tree for these collectives: it is skipped (bandwidth 0, time -1).
    for (const auto& e : lab::nccl_estimates(hopper(16), coll, 16e6)) {
      if (e.algo != NcclAlgo::Tree) continue;
      EXPECT_FALSE(e.enabled);
      EXPECT_EQ(e.time_us, -1.0);
    }
  }
  // Falls monotonically with scale.
  double last = 1e30;
  for (int gpus : {16, 64, 256, 1024}) {
    const double gbps = 16e6 / lab::nccl_choice(hopper(gpus), NcclColl::AllGather, 16e6).time_us / 1e3;
    EXPECT_LT(gbps, last);
    last = gbps;
  }
}

// LL: ring min(llMaxBw, 0.5 * bus) <= half of ring Simple's bus (same n/nsteps conversion); tree
// min(bus'/3.8, llMaxBw) <= bus'/3.8 < half of tree Simple's bus' (same 0.5 conversion). With the
// size factors, LL/Simple's worst ratio is (1/3.8) * 1.0 / 0.7 = 0.376 (index 19).
TEST(NcclModelBandwidth, LLNeverAboveHalfSimple) {
  for (int nodes : {1, 2, 4, 8, 128}) {
    for (int arch : {700, 800, 900, 1000}) {
      for (auto cpu : {lab::NcclCpu::IntelX86, lab::NcclCpu::AmdX86}) {
        lab::NcclModelInputs in;
        in.nodes = nodes;
        in.cuda_arch = arch;
        in.cpu = cpu;
        for (NcclColl coll : {NcclColl::AllReduce, NcclColl::AllGather, NcclColl::ReduceScatter, NcclColl::Broadcast}) {
          const auto t = lab::nccl_tune_model(in, coll);
          for (NcclAlgo a : {NcclAlgo::Tree, NcclAlgo::Ring}) {
            const auto& ll = entry(t, a, NcclProto::LL);
            const auto& simple = entry(t, a, NcclProto::Simple);
            if (!simple.enabled) continue;
            EXPECT_LE(ll.bandwidth_GBps, 0.5 * simple.bandwidth_GBps + 1e-12);
          }
          for (int k = 6; k <= 40; k++) {
            const auto est = lab::nccl_estimates(in, coll, std::ldexp(1.0, k));
            for (NcclAlgo a : {NcclAlgo::Tree, NcclAlgo::Ring}) {
              const auto& ll = entry(est, a, NcclProto::LL);
              const auto& simple = entry(est, a, NcclProto::Simple);
              if (!simple.enabled) continue;
              EXPECT_LE(ll.bandwidth_GBps, 0.5 * simple.bandwidth_GBps + 1e-12);
            }
          }
        }
      }
    }
  }
}

// One node: every hop is an NVLink hop, no network overhead floor, no plateau, no net latency.
//   ring (nsteps 14): LL 6.6 + 14*0.6 = 15.0; LL128 14 + 14*1.9 = 40.6; Simple 8.4 + 14*3.4 = 56.0
//   tree: LL 6.8 + 2*7*0.6 = 15.2; LL128 14 + 2*7*1.25 = 31.5; Simple 8.4 + 2*7*4.0 = 64.4
// PCI instead: ring Simple 8.4 + 14*5.7 = 88.2, tree Simple 8.4 + 14*4.0 = 64.4, LL128 off (path > NVB).
// Bandwidths: llMaxBw Hopper-N1 141; ring LL min(141, 185) * 8/14 = 80.571; tree LL128 factor 7/9:
//   min(340.4 * 7/9 = 264.756, 16*36.7 = 587.2) * .5 = 132.378.
TEST(NcclModelSingleNode, UsesNvlinkHopsOnly) {
  lab::NcclModelInputs in;  // nodes = 1, 8 GPUs
  in.net_latency_us = 100;  // would show on any network hop
  const auto t = lab::nccl_tune_model(in, NcclColl::AllReduce);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::LL).latency_us, 15.0, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::LL128).latency_us, 40.6, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::Simple).latency_us, 56.0, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::LL).latency_us, 15.2, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::LL128).latency_us, 31.5, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::Simple).latency_us, 64.4, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::LL).bandwidth_GBps, 141.0 * 8 / 14, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Tree, NcclProto::LL128).bandwidth_GBps, 340.4 * 7 / 9 * 0.5, 1e-9);
  // No plateau at 1 GiB on one node.
  EXPECT_NEAR(entry(lab::nccl_estimates(in, NcclColl::AllReduce, 1 << 30), NcclAlgo::Ring, NcclProto::Simple).latency_us, 56.0, 1e-9);
  // Ring wins from 1 KiB up (ring LL 15.0 + 1024/80571 beats tree LL 15.2 + 1024/(44.79*.9*1000)): no switch.
  EXPECT_EQ(lab::nccl_ring_tree_crossover(in), 0.0);

  in.nvlink = false;
  const auto pci = lab::nccl_tune_model(in, NcclColl::AllReduce);
  EXPECT_NEAR(entry(pci, NcclAlgo::Ring, NcclProto::Simple).latency_us, 88.2, 1e-9);
  EXPECT_NEAR(entry(pci, NcclAlgo::Tree, NcclProto::Simple).latency_us, 64.4, 1e-9);
  EXPECT_FALSE(entry(pci, NcclAlgo::Ring, NcclProto::LL128).enabled);
  EXPECT_FALSE(entry(pci, NcclAlgo::Tree, NcclProto::LL128).enabled);
}

// Broadcast: ring only, nsteps = n, algbw = bus * n/n. 16 GPUs Simple, same channels: 8.4 + one NET ring
// Simple hop 14.0 = 22.4; without: 8.4 + 16 * (NET tree Simple 14) = 232.4. Bandwidth 370.
TEST(NcclModelBroadcast, RingOnlyLatency) {
  auto in = hopper(16);
  auto t = lab::nccl_tune_model(in, NcclColl::Broadcast);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::Simple).latency_us, 22.4, 1e-9);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::Simple).bandwidth_GBps, 370.0, 1e-9);
  EXPECT_FALSE(entry(t, NcclAlgo::Tree, NcclProto::Simple).enabled);
  in.same_channels = false;
  t = lab::nccl_tune_model(in, NcclColl::Broadcast);
  EXPECT_NEAR(entry(t, NcclAlgo::Ring, NcclProto::Simple).latency_us, 232.4, 1e-9);
}

// One rank: ring/Simple, time 0.
TEST(NcclModelChoice, OneRankCostsNothing) {
  lab::NcclModelInputs in;
  in.gpus_per_node = 1;
  const auto c = lab::nccl_choice(in, NcclColl::AllReduce, 1e9);
  EXPECT_EQ(c.algo, NcclAlgo::Ring);
  EXPECT_EQ(c.proto, NcclProto::Simple);
  EXPECT_EQ(c.time_us, 0.0);
}

TEST(NcclModelErrors, RefusesBadInputs) {
  auto expect_refused = [](lab::NcclModelInputs in, const std::string& field, const std::string& value) {
    try {
      lab::nccl_choice(in, NcclColl::AllReduce, 1024);
      ADD_FAILURE() << field << " accepted";
    } catch (const lab::ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(field), std::string::npos) << msg;
      EXPECT_NE(msg.find(value), std::string::npos) << msg;
    }
  };
  lab::NcclModelInputs in;
  in.nodes = 0;
  expect_refused(in, "nodes", "0");
  in = {};
  in.gpus_per_node = -2;
  expect_refused(in, "gpus_per_node", "-2");
  in = {};
  in.channels = 0;
  expect_refused(in, "channels", "0");
  in = {};
  in.bw_intra_GBps = 0;
  expect_refused(in, "bw_intra_GBps", "0");
  in = {};
  in.bw_inter_GBps = -1.5;
  expect_refused(in, "bw_inter_GBps", "-1.5");
  EXPECT_THROW(lab::nccl_estimates(lab::NcclModelInputs{}, NcclColl::AllReduce, -1), lab::ConfigError);
  lab::NcclModelInputs none;
  none.nodes = 2;
  none.algo_allowed[1] = false;  // allgather has no tree: nothing left
  EXPECT_THROW(lab::nccl_choice(none, NcclColl::AllGather, 1024), lab::ConfigError);
}

// The constants one at a time (tuning.cc's baseLatencies, hwLatencies and model refinements).
TEST(NcclModelConstants, Accessors) {
  EXPECT_EQ(lab::nccl_base_latency_us(NcclAlgo::Tree, NcclProto::LL), 6.8);
  EXPECT_EQ(lab::nccl_base_latency_us(NcclAlgo::Ring, NcclProto::LL), 6.6);
  EXPECT_EQ(lab::nccl_base_latency_us(NcclAlgo::Ring, NcclProto::LL128), 14.0);
  EXPECT_EQ(lab::nccl_base_latency_us(NcclAlgo::Tree, NcclProto::Simple), 8.4);
  EXPECT_EQ(lab::nccl_hop_latency_us(NcclAlgo::Ring, NcclProto::LL128, false, true), 1.9);
  EXPECT_EQ(lab::nccl_hop_latency_us(NcclAlgo::Tree, NcclProto::LL128, false, true), 1.25);
  EXPECT_EQ(lab::nccl_hop_latency_us(NcclAlgo::Ring, NcclProto::Simple, false, false), 5.7);
  EXPECT_EQ(lab::nccl_hop_latency_us(NcclAlgo::Ring, NcclProto::LL, true, true), 2.7);
  EXPECT_EQ(lab::nccl_hop_latency_us(NcclAlgo::Tree, NcclProto::LL128, true, false), 8.5);
  EXPECT_EQ(lab::nccl_bandwidth_factor(NcclAlgo::Ring, NcclProto::LL), 0.5);
  EXPECT_EQ(lab::nccl_bandwidth_factor(NcclAlgo::Ring, NcclProto::LL128), 0.92);
  EXPECT_EQ(lab::nccl_bandwidth_factor(NcclAlgo::Ring, NcclProto::Simple), 1.0);
  EXPECT_DOUBLE_EQ(lab::nccl_bandwidth_factor(NcclAlgo::Tree, NcclProto::Simple), 0.92);
  EXPECT_DOUBLE_EQ(lab::nccl_bandwidth_factor(NcclAlgo::Tree, NcclProto::LL128), 0.92 * 120 / 128);
  EXPECT_DOUBLE_EQ(lab::nccl_bandwidth_factor(NcclAlgo::Tree, NcclProto::LL128, true), 0.92 * 7 / 9);
  EXPECT_DOUBLE_EQ(lab::nccl_bandwidth_factor(NcclAlgo::Tree, NcclProto::LL), 0.92 / 3.8);
}
