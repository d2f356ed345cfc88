// NCCL's cost model for Tree and Ring collectives, pinned to NCCL v2.30.7-1 (see nccl_model.h).
// Our own code for the same arithmetic; every constant names the array of src/graph/tuning.cc
// (v2.30.7-1) it comes from. Index conventions, as in the source: algorithm {Tree, Ring}, protocol
// {LL, LL128, Simple}, hop type {NVLink, PCI, NET} (NCCL_HW_*), architecture row {Volta, Ampere,
// Hopper, Blackwell} (NCCL_*_COMPCAP_IDX), node-count column {1 node, 2 nodes, more} ("N1/N2/N4").
#include "nccl_model.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "errors.h"

namespace lab {

namespace {

constexpr int kTree = 0, kRing = 1;
constexpr int kLL = 0, kLL128 = 1, kSimple = 2;
constexpr int kNvlink = 0, kPci = 1, kNet = 2;

// tuning.cc, ncclTunerConstantsDefaults.baseLatencies, rows Tree and Ring (us).
constexpr double kBaseLatencyUs[2][3] = {
    {6.8, 14.0, 8.4},  // Tree
    {6.6, 14.0, 8.4},  // Ring
};

// tuning.cc, ncclTunerConstantsDefaults.hwLatencies[NVLINK|PCI|NET], rows Tree and Ring (us per hop).
constexpr double kHopLatencyUs[3][2][3] = {
    {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}},   // NVLink: Tree, Ring
    {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}},    // PCI:    Tree, Ring
    {{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}},  // NET:    Tree, Ring
};

// tuning.cc, ncclTunerConstantsDefaults.llMaxBws (GB/s). One node: the row is the GPU architecture;
// several nodes: row 0 (Intel/other CPU) or row 1 (AMD or mixed CPU vendors). Columns N1/N2/N4.
constexpr double kLlMaxBwGBps[4][3] = {
    {39.0, 39.0, 20.4},            // Volta-N1 / Intel-N2 / Intel-N4
    {87.7, 22.5, 19.0},            // Ampere-N1 / AMD-N2 / AMD-N4
    {141.0, 45.0, 35.0},           // Hopper-N1 / (N2, N4 unreachable: multi-node uses rows 0-1)
    {2 * 141.0, 2 * 45.0, 2 * 35.0},  // Blackwell-N1
};

// tuning.cc, ncclTunerConstantsDefaults.perChMaxRingLL128Bws (GB/s per channel), architecture x N1/N2/N4.
constexpr double kPerChMaxRingLL128GBps[4][3] = {
    {20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 36.7}, {40.0, 40.0, 40.0}};

// tuning.cc, ncclTunerConstantsDefaults.perChMaxTreeLL128Bws (GB/s per channel).
constexpr double kPerChMaxTreeLL128GBps[4][3] = {
    {20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}};

// tuning.cc, ncclTunerConstantsDefaults.perChMaxTreeBws (GB/s per channel).
constexpr double kPerChMaxTreeGBps[4][3] = {
    {26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}};

// tuning.cc, ncclTopoTuneModel's "model refinements" (factors applied to the bus bandwidth).
constexpr double kRingLLFactor = 0.5;               // ring LL: half, at most llMaxBw
constexpr double kRingLL128Factor = 0.92;           // ring LL128 (the source's comment: 120/128)
constexpr double kTreeAllReduceFactor = 0.92;       // tree allreduce, all protocols, then the per-channel cap
constexpr double kTreeLLDivisor = 3.8;              // tree LL: 1/3.8, at most llMaxBw
constexpr double kTreeLL128OneNode = 7.0 / 9.0;     // tree LL128 on one node
constexpr double kTreeLL128MultiNode = 120.0 / 128.0;  // tree LL128 across nodes
constexpr double kTreePatternTreeFactor = 0.85;     // comm->maxTreePattern == NCCL_TOPO_PATTERN_TREE
constexpr double kTreeBusToAlg = 0.5;               // tree: algbw = busbw * 0.5
constexpr double kSimpleNetOverheadSteps = 3;       // ring Simple: 3 x the network overhead per step

// tuning.cc, getNetOverhead (us): Intel x86 1.0, AMD x86 2.0, anything else 1.0.
constexpr double kNetOverheadIntelUs = 1.0, kNetOverheadAmdUs = 2.0, kNetOverheadOtherUs = 1.0;

// tuning.cc, ncclTopoGetAlgoTime: the ring plateau factor on ring/Simple allreduce latency across
// nodes once nBytes / (comm->nChannels * nRanks) >= 64; 1.9 before sm80, 1.4 from sm80 on.
constexpr double kPlateauBeforeAmpere = 1.9, kPlateauAmpereOn = 1.4;
constexpr double kPlateauMinBytesPerChannelRank = 64;

// tuning.cc, treeCorrectionFactor[protocol][log2(nBytes / 64)]: tree allreduce bandwidth factor by
// size, 64 B up; the source applies it while the index is below 23 (sizes under 512 MiB), so the
// table's last entry is never read.
constexpr int kTreeCorrectionUsed = 23;
constexpr double kTreeCorrection[3][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9},
};

// src/include/device.h MAXCHANNELS; connect.cc's rule for Hopper multi-node (bwIntra > 45, < 16 channels).
constexpr int kMaxChannels = 64;
constexpr double kHopperChannelDoublingBw = 45.0;
constexpr int kHopperChannelDoublingBelow = 16;

int arch_row(int comp_cap) {
  if (comp_cap >= 100) return 3;  // Blackwell
  if (comp_cap >= 90) return 2;   // Hopper
  if (comp_cap >= 80) return 1;   // Ampere
  return 0;                       // Volta (and older)
}

// floor(log2(n)) for n >= 1; -1 for 0 (NCCL's log2Down).
int floor_log2(uint64_t n) {
  int r = -1;
  while (n) {
    n >>= 1;
    ++r;
  }
  return r;
}

template <typename T>
[[noreturn]] void refuse(const char* field, T value, const char* rule) {
  std::ostringstream os;
  os << "nccl model: " << field << " = " << value << " (" << rule << ")";
  throw ConfigError(os.str());
}

void validate(const NcclModelInputs& in) {
  if (in.nodes < 1) refuse("nodes", in.nodes, "must be >= 1");
  if (in.gpus_per_node < 1) refuse("gpus_per_node", in.gpus_per_node, "must be >= 1");
  if (in.channels < 1) refuse("channels", in.channels, "must be >= 1");
  if (!(in.bw_intra_GBps > 0) || !std::isfinite(in.bw_intra_GBps)) refuse("bw_intra_GBps", in.bw_intra_GBps, "must be > 0");
  if (!(in.bw_inter_GBps > 0) || !std::isfinite(in.bw_inter_GBps)) refuse("bw_inter_GBps", in.bw_inter_GBps, "must be > 0");
  if (in.cuda_arch < 1) refuse("cuda_arch", in.cuda_arch, "must be >= 1, e.g. 900");
  if (!(in.net_latency_us >= 0) || !std::isfinite(in.net_latency_us)) refuse("net_latency_us", in.net_latency_us, "must be >= 0");
  if (std::isnan(in.net_overhead_us)) refuse("net_overhead_us", in.net_overhead_us, "must be a number (< 0: default)");
  if (in.comm_channels < 0) refuse("comm_channels", in.comm_channels, "must be >= 0 (0: derived)");
}

int comm_channels(const NcclModelInputs& in) {
  if (in.comm_channels > 0) return in.comm_channels;
  int c = std::min(kMaxChannels, 2 * in.channels);
  if (in.cuda_arch / 10 >= 90 && in.nodes > 1 && in.bw_intra_GBps / in.channels > kHopperChannelDoublingBw &&
      c < kHopperChannelDoublingBelow)
    c = std::min(kMaxChannels, 2 * c);
  return c;
}

double net_overhead_us(const NcclModelInputs& in) {
  if (in.net_overhead_us >= 0) return in.net_overhead_us;
  switch (in.cpu) {
    case NcclCpu::IntelX86: return kNetOverheadIntelUs;
    case NcclCpu::AmdX86: return kNetOverheadAmdUs;
    default: return kNetOverheadOtherUs;
  }
}

// LL128's default enable (tuning.cc, the protoEnable == 2 branch): sm70+, intra-node path up to NVB
// (NVLink here; PCI paths are beyond it), NIC path up to PXN on sm90+ (NCCL_LL128_C2C=1) or PXB before.
bool ll128_default_enabled(const NcclModelInputs& in) {
  const int cc = in.cuda_arch / 10;
  if (cc < 70) return false;
  if (!in.nvlink) return false;
  const NcclNicPath limit = cc >= 90 ? NcclNicPath::PXN : NcclNicPath::PXB;
  return static_cast<int>(in.nic_path) <= static_cast<int>(limit);
}

}  // namespace

const char* nccl_algo_name(NcclAlgo a) { return a == NcclAlgo::Tree ? "tree" : "ring"; }

const char* nccl_proto_name(NcclProto p) {
  switch (p) {
    case NcclProto::LL: return "LL";
    case NcclProto::LL128: return "LL128";
    default: return "Simple";
  }
}

const char* nccl_coll_name(NcclColl c) {
  switch (c) {
    case NcclColl::AllReduce: return "allreduce";
    case NcclColl::ReduceScatter: return "reducescatter";
    case NcclColl::AllGather: return "allgather";
    default: return "broadcast";
  }
}

double nccl_base_latency_us(NcclAlgo algo, NcclProto proto) {
  return kBaseLatencyUs[static_cast<int>(algo)][static_cast<int>(proto)];
}

double nccl_hop_latency_us(NcclAlgo algo, NcclProto proto, bool net, bool nvlink) {
  const int hw = net ? kNet : (nvlink ? kNvlink : kPci);
  return kHopLatencyUs[hw][static_cast<int>(algo)][static_cast<int>(proto)];
}

double nccl_bandwidth_factor(NcclAlgo algo, NcclProto proto, bool one_node) {
  const int p = static_cast<int>(proto);
  if (algo == NcclAlgo::Ring) return p == kLL ? kRingLLFactor : p == kLL128 ? kRingLL128Factor : 1.0;
  if (p == kLL) return kTreeAllReduceFactor / kTreeLLDivisor;
  if (p == kLL128) return kTreeAllReduceFactor * (one_node ? kTreeLL128OneNode : kTreeLL128MultiNode);
  return kTreeAllReduceFactor;
}

NcclProtocolCosts nccl_protocol_costs(const NcclModelInputs& in, NcclAlgo algo, NcclProto proto) {
  validate(in);
  const int a = static_cast<int>(algo);
  const int p = static_cast<int>(proto);
  const int nodes = in.nodes;
  const int arch = arch_row(in.cuda_arch / 10);
  const int col = std::min(nodes - 1, 2);  // N1 / N2 / N4
  // LL's cap: by GPU on one node, by CPU vendor across nodes.
  const int ll_row = nodes == 1 ? arch : (in.cpu == NcclCpu::AmdX86 ? 1 : 0);
  const double ll_max = kLlMaxBwGBps[ll_row][col];
  NcclProtocolCosts c;
  // The bus bandwidth's refinements as one factor and one cap: bus = min(bw x factor, cap).
  c.bus_factor = 1.0;
  c.bus_cap_GBps = HUGE_VAL;
  if (a == kRing && p == kLL) {
    c.bus_factor = kRingLLFactor;
    c.bus_cap_GBps = ll_max;
  }
  if (a == kRing && p == kLL128) {
    c.bus_factor = kRingLL128Factor;
    c.bus_cap_GBps = in.channels * kPerChMaxRingLL128GBps[arch][col];
  }
  if (a == kTree) {
    c.bus_factor = kTreeAllReduceFactor;
    c.bus_cap_GBps = in.channels * kPerChMaxTreeGBps[arch][col];
    if (p == kLL) {
      c.bus_factor /= kTreeLLDivisor;
      c.bus_cap_GBps = std::min(c.bus_cap_GBps / kTreeLLDivisor, ll_max);
    }
    if (p == kLL128) {
      const double f = nodes == 1 ? kTreeLL128OneNode : kTreeLL128MultiNode;
      c.bus_factor *= f;
      c.bus_cap_GBps = std::min(c.bus_cap_GBps * f, in.channels * kPerChMaxTreeLL128GBps[arch][col]);
    }
    if (in.tree_pattern == NcclTreePattern::Tree) {
      c.bus_factor *= kTreePatternTreeFactor;
      c.bus_cap_GBps *= kTreePatternTreeFactor;
    }
  }
  // Latencies; on POWER the source makes tree's PCI Simple hop as slow as ring's.
  double pci_tree_simple = kHopLatencyUs[kPci][kTree][kSimple];
  if (in.cpu == NcclCpu::Power) pci_tree_simple = kHopLatencyUs[kPci][kRing][kSimple];
  const int intra_hw = in.nvlink ? kNvlink : kPci;
  c.base_us = kBaseLatencyUs[a][p];
  c.intra_hop_us = (intra_hw == kPci && a == kTree && p == kSimple) ? pci_tree_simple : kHopLatencyUs[intra_hw][a][p];
  // With one GPU per node every hop is a network hop: the tree's network latency is used.
  c.inter_hop_us = (in.gpus_per_node == 1 ? kHopLatencyUs[kNet][kTree][p] : kHopLatencyUs[kNet][a][p]) + in.net_latency_us;
  if (p == kSimple) c.inter_hop_us += in.net_latency_us;  // the flush
  // Across nodes each ring step still pays the network overhead (3x for Simple), which floors the
  // intra-node steps' latency (not broadcast's: the tune model charges it its own way).
  c.ring_intra_hop_us = c.intra_hop_us;
  if (a == kRing && nodes > 1)
    c.ring_intra_hop_us = std::max(c.intra_hop_us, net_overhead_us(in) * (p == kSimple ? kSimpleNetOverheadSteps : 1.0));
  return c;
}

std::vector<NcclTuned> nccl_tune_model(const NcclModelInputs& in, NcclColl coll) {
  validate(in);
  std::vector<NcclTuned> table;
  for (int a = 0; a < 2; a++)
    for (int p = 0; p < 3; p++) table.push_back({static_cast<NcclAlgo>(a), static_cast<NcclProto>(p), 0.0, 0.0, false});

  const int nodes = in.nodes;
  const int ppn = in.gpus_per_node;
  const int ranks = nodes * ppn;
  if (ranks <= 1) return table;  // the source returns before filling the table

  // Broadcast's hop: the network's across nodes, else the node's (POWER's PCI tree Simple rule
  // as nccl_protocol_costs applies it).
  const int intra_hw = in.nvlink ? kNvlink : kPci;
  auto broadcast_hop = [&](int a, int p) {
    if (nodes > 1) return kHopLatencyUs[kNet][a][p];
    if (in.cpu == NcclCpu::Power && intra_hw == kPci && a == kTree && p == kSimple) return kHopLatencyUs[kPci][kRing][kSimple];
    return kHopLatencyUs[intra_hw][a][p];
  };

  // Ring steps: allreduce 2(n-1), reduce-scatter/all-gather n-1, broadcast n.
  const int nsteps = coll == NcclColl::AllReduce ? 2 * (ranks - 1)
                     : (coll == NcclColl::ReduceScatter || coll == NcclColl::AllGather) ? ranks - 1
                                                                                         : ranks;
  const bool ll128_ok = ll128_default_enabled(in);

  for (NcclTuned& e : table) {
    const int a = static_cast<int>(e.algo);
    const int p = static_cast<int>(e.proto);
    if (a == kTree && coll != NcclColl::AllReduce) continue;  // tree: allreduce only (of these four)

    // Bus bandwidth: the whole intra figure up to two nodes, the network figure beyond, then the
    // protocol's factor and cap.
    const NcclProtocolCosts costs = nccl_protocol_costs(in, e.algo, e.proto);
    const double bus = std::min((nodes <= 2 ? in.bw_intra_GBps : in.bw_inter_GBps) * costs.bus_factor, costs.bus_cap_GBps);
    // Bus bandwidth to algorithm bandwidth.
    const double algbw = a == kRing ? bus * ranks / nsteps : bus * kTreeBusToAlg;

    // Latency.
    double lat = costs.base_us;
    if (a == kRing) {
      if (coll == NcclColl::Broadcast) {
        double step = broadcast_hop(kRing, p);
        if (in.same_channels) {
          lat += step;
        } else {
          if (p == kSimple) step = broadcast_hop(kTree, kSimple);
          lat += nsteps * step;
        }
      } else {
        // Each inter-node ring step still pays the network overhead (costs.ring_intra_hop_us).
        const int inter_steps = nodes == 1 ? 0 : (coll == NcclColl::AllReduce ? 2 * (nodes - 1) : nodes - 1);
        lat += (nsteps - inter_steps) * costs.ring_intra_hop_us + inter_steps * costs.inter_hop_us;
      }
    } else {
      // Tree allreduce: up and down a chain of ppn GPUs and a tree of depth log2(nodes).
      lat += 2 * ((ppn - 1) * costs.intra_hop_us + floor_log2(static_cast<uint64_t>(nodes)) * costs.inter_hop_us);
    }

    bool on = in.algo_allowed[a] && in.proto_allowed[p];
    if (p == kLL128) on = on && ll128_ok;
    if (!on || !(algbw > 0)) continue;
    e.latency_us = lat;
    e.bandwidth_GBps = algbw;
    e.enabled = true;
  }
  return table;
}

NcclSizeFactors nccl_size_factors(const NcclModelInputs& in, NcclColl coll, NcclAlgo algo, NcclProto proto,
                                  double bytes) {
  NcclSizeFactors f;
  const int ranks = in.nodes * in.gpus_per_node;
  const uint64_t nbytes = bytes >= 0x1p63 ? (uint64_t(1) << 63) : static_cast<uint64_t>(bytes);
  const int log_size = floor_log2(nbytes >> 6);
  if (algo == NcclAlgo::Tree && coll == NcclColl::AllReduce && log_size >= 0 && log_size < kTreeCorrectionUsed)
    f.bandwidth = kTreeCorrection[static_cast<int>(proto)][log_size];
  if (algo == NcclAlgo::Ring && proto == NcclProto::Simple && in.nodes > 1 && coll == NcclColl::AllReduce &&
      bytes / (static_cast<double>(comm_channels(in)) * ranks) >= kPlateauMinBytesPerChannelRank)
    f.latency = in.cuda_arch / 10 < 80 ? kPlateauBeforeAmpere : kPlateauAmpereOn;
  return f;
}

std::vector<NcclEstimate> nccl_estimates(const NcclModelInputs& in, NcclColl coll, double bytes) {
  if (!(bytes >= 0) || !std::isfinite(bytes)) refuse("bytes", bytes, "must be >= 0");
  const std::vector<NcclTuned> table = nccl_tune_model(in, coll);
  const int ranks = in.nodes * in.gpus_per_node;
  std::vector<NcclEstimate> out;
  if (ranks == 1) {
    // updateCollCostTable: one rank, ring/Simple costs nothing, everything else is ignored.
    for (const NcclTuned& e : table) {
      const bool ring_simple = e.algo == NcclAlgo::Ring && e.proto == NcclProto::Simple;
      out.push_back({e.algo, e.proto, 0.0, 0.0, ring_simple ? 0.0 : -1.0, ring_simple});
    }
    return out;
  }
  for (const NcclTuned& e : table) {
    if (!e.enabled) {
      out.push_back({e.algo, e.proto, 0.0, 0.0, -1.0, false});
      continue;
    }
    const NcclSizeFactors f = nccl_size_factors(in, coll, e.algo, e.proto, bytes);
    const double bw = e.bandwidth_GBps * f.bandwidth;
    const double lat = e.latency_us * f.latency;
    // GB/s = 1000 bytes per microsecond.
    out.push_back({e.algo, e.proto, lat, bw, lat + bytes / (1000.0 * bw), true});
  }
  return out;
}

NcclEstimate nccl_choice(const NcclModelInputs& in, NcclColl coll, double bytes) {
  const std::vector<NcclEstimate> all = nccl_estimates(in, coll, bytes);
  const NcclEstimate* best = nullptr;
  double best_time = DBL_MAX;
  for (const NcclEstimate& e : all) {
    if (e.enabled && e.time_us >= 0 && e.time_us < best_time) {  // strict: the earlier wins a tie
      best = &e;
      best_time = e.time_us;
    }
  }
  if (!best)
    throw ConfigError(std::string("nccl model: no algorithm/protocol available for ") + nccl_coll_name(coll),
                      "algo_allowed / proto_allowed exclude every Tree/Ring combination that applies");
  return *best;
}

double nccl_ring_tree_crossover(const NcclModelInputs& in) {
  NcclAlgo previous = nccl_choice(in, NcclColl::AllReduce, std::ldexp(1.0, 10)).algo;
  for (int k = 11; k <= 40; k++) {
    const double size = std::ldexp(1.0, k);
    const NcclAlgo now = nccl_choice(in, NcclColl::AllReduce, size).algo;
    if (previous == NcclAlgo::Tree && now == NcclAlgo::Ring) return size;
    previous = now;
  }
  return 0;
}

}  // namespace lab
