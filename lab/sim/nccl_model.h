// NCCL's own cost model for collectives, in our words, pinned to NCCL v2.30.7-1
// (github.com/NVIDIA/nccl, tag v2.30.7-1, commit 73cf112295c33aee2b895f329f592f2a9b4b0f97).
//
// What it reproduces:
//   src/graph/tuning.cc  ncclTopoTuneModel    one latency (us) and one bandwidth (GB/s, "algbw") per
//                                             (collective, algorithm, protocol), computed once per
//                                             communicator from what the topology search found;
//   src/graph/tuning.cc  ncclTopoGetAlgoTime  time = latency + nBytes / bandwidth, with the tree
//                                             correction factors and ring's "plateau" factor (this
//                                             function lives in tuning.cc, not in enqueue.cc);
//   src/enqueue.cc       updateCollCostTable, topoGetAlgoInfo
//                                             the table of times and the choice of the smallest.
//
// Scope: the Tree and Ring algorithms only. CollNet (Direct/Chain), NVLS, NVLS-Tree and PAT are out
// of scope. Real NCCL on an NVSwitch system (DGX/HGX Hopper) also weighs NVLS (one node) and
// NVLS-Tree (several nodes), which often win for allreduce; this model's choice is the choice among
// Tree and Ring only. Also not modelled: a tuner plugin, NCCL_ALGO/NCCL_PROTO per-function lists and
// forcing LL128 on (see `proto_allowed`), the fp8 ring penalty, aggregation (numPipeOps is 1), the
// CUDA 11.8 / sm90 / 2-rank ring-allreduce LL128 quirk (we assume another CUDA runtime), and the
// channel/thread tuning that follows the choice. Arithmetic is in double where NCCL uses float:
// results agree to float's precision (about 1e-6 relative).
#pragma once

#include <string>
#include <vector>

namespace lab {

// NCCL's order: NCCL_ALGO_TREE = 0, NCCL_ALGO_RING = 1 (src/include/plugin/nccl_tuner.h).
enum class NcclAlgo { Tree, Ring };
// NCCL's order: NCCL_PROTO_LL = 0, NCCL_PROTO_LL128 = 1, NCCL_PROTO_SIMPLE = 2 (so LL is 0: a cast
// from an enum ordered Simple, LL128, LL maps Simple onto LL).
enum class NcclProto { LL, LL128, Simple };
const char* nccl_algo_name(NcclAlgo);    // "tree", "ring"
const char* nccl_proto_name(NcclProto);  // "LL", "LL128", "Simple"

enum class NcclColl { AllReduce, ReduceScatter, AllGather, Broadcast };
const char* nccl_coll_name(NcclColl);    // "allreduce", "reducescatter", "allgather", "broadcast"

// The host CPU as NCCL's topology detection classifies it (comm->cpuArch / comm->cpuVendor). It picks
// the row of llMaxBws for multi-node LL (AMD: row 1, else row 0), the default network overhead per
// ring step (getNetOverhead: Intel x86 1 us, AMD x86 2 us, others 1 us) and, on POWER, makes tree's
// PCI Simple hop latency equal ring's.
enum class NcclCpu { IntelX86, AmdX86, Arm, Power };

// The tree graph's pattern (graph->pattern, NCCL_TOPO_PATTERN_*); comm->maxTreePattern == TREE (all
// NIC traffic through one GPU) costs tree 15% of its bandwidth. The search normally finds BALANCED_TREE.
enum class NcclTreePattern { Balanced, Split, Tree };

// The best GPU-to-NIC path the search used (graph->typeInter, PATH_* in src/include/graph.h, in that
// order). LL128 is on by default only up to PXN on sm90+ (NCCL_LL128_C2C=1, the default), up to PXB
// before sm90.
enum class NcclNicPath { PIX, PXB, P2C, PXN, PHB, SYS };

// What NCCL's topology search would have found, as plain inputs (no search here). NCCL's graphs
// carry a per-channel bandwidth (graph->bwIntra, graph->bwInter) and a channel count
// (graph->nChannels); the model only ever uses nChannels * bw, so the bandwidths here are those
// products, and ring and tree are assumed to have found the same graph figures.
struct NcclModelInputs {
  int nodes = 1;                   // comm->nNodes
  int gpus_per_node = 8;           // ranks per node (ppn); nRanks = nodes * gpus_per_node
  int channels = 16;               // graph->nChannels: the search's channel count (caps: perChMax*Bws * channels)
  // graph->nChannels * graph->bwIntra: the bus bandwidth per GPU the search found inside a node
  // (GB/s). The source uses it for every (algo, proto) whenever nodes <= 2, even though two nodes'
  // rings and trees cross the network.
  double bw_intra_GBps = 370;
  // graph->nChannels * graph->bwInter: the network bandwidth the channels found, i.e. per GPU's
  // share of its node's NICs as one ring/tree sees it (8 NICs x 48.5 GB/s shared by 8 GPUs' rings
  // give 388). The source uses it instead of bw_intra whenever nodes > 2.
  double bw_inter_GBps = 48.5 * 8;
  int cuda_arch = 900;             // e.g. 700/800/900/1000; NCCL's compCap = cuda_arch / 10 picks the
                                   // Volta/Ampere/Hopper/Blackwell row of llMaxBws, perChMax*Bws
  bool nvlink = true;              // intra-node hop type (graph->typeIntra == LINK_NVL): NVLink, else PCI
  NcclCpu cpu = NcclCpu::IntelX86;
  NcclTreePattern tree_pattern = NcclTreePattern::Balanced;
  NcclNicPath nic_path = NcclNicPath::PIX;
  // graph->latencyInter: the net plugin's props.latency (us). IB and sockets leave it 0 ("Not set").
  // Added to every inter-node hop, twice for Simple (the flush).
  double net_latency_us = 0;
  // NCCL_NET_OVERHEAD in us; < 0: the CPU's default (see NcclCpu).
  double net_overhead_us = -1;
  // comm->nChannels after the channels are connected (connect.cc: the search's count doubled, at most
  // 64, doubled again on sm90+ multi-node when a channel's bwIntra > 45 GB/s and fewer than 16).
  // Only the ring plateau's threshold reads it. 0: derive it that way from `channels`.
  int comm_channels = 0;
  // graph->sameChannels of the ring graph (the search tries same channels first): broadcast's
  // latency is one hop when set, nRanks hops when not.
  bool same_channels = true;
  // Like NCCL_ALGO / NCCL_PROTO without per-function prefixes: false removes it. true keeps the
  // default rules (LL128 stays subject to its default enable checks).
  bool algo_allowed[2] = {true, true};          // Tree, Ring
  bool proto_allowed[3] = {true, true, true};   // LL, LL128, Simple
};

// The source's constants one at a time (for models that build their own schedules, e.g.
// collective_sim.cpp). baseLatencies[algo][proto] (us, once per collective):
double nccl_base_latency_us(NcclAlgo algo, NcclProto proto);
// hwLatencies[hop][algo][proto] (us per hop): the NET row when `net`, else NVLink or PCI.
double nccl_hop_latency_us(NcclAlgo algo, NcclProto proto, bool net, bool nvlink);
// The factor ncclTopoTuneModel applies to the bus bandwidth for (algo, proto), leaving out the caps
// (llMaxBws, perChMax*Bws x nChannels), the busbw -> algbw conversion and the size factors:
// ring LL 0.5, LL128 0.92, Simple 1; tree (allreduce) Simple 0.92, LL128 0.92 x 120/128 (x 7/9 on
// one node), LL 0.92 / 3.8.
double nccl_bandwidth_factor(NcclAlgo algo, NcclProto proto, bool one_node = false);

// What ncclTopoTuneModel charges for (algo, proto), for models that build their own schedules
// (collective_sim.cpp): the bus bandwidth is min(bandwidth x bus_factor, bus_cap_GBps) (the
// factors above with the caps llMaxBws and channels x perChMax*Bws; infinite where none); a
// collective pays base_us once, intra_hop_us per hop inside a node (ring_intra_hop_us for a
// ring's hops when it spans nodes: the network overhead's floor) and inter_hop_us per hop between
// nodes (one GPU per node: the tree's network latency; plus the net plugin's latency, twice for
// Simple).
struct NcclProtocolCosts {
  double base_us = 0;
  double intra_hop_us = 0;
  double ring_intra_hop_us = 0;
  double inter_hop_us = 0;
  double bus_factor = 1;
  double bus_cap_GBps = 0;
};
NcclProtocolCosts nccl_protocol_costs(const NcclModelInputs& in, NcclAlgo algo, NcclProto proto);

// ncclTopoGetAlgoTime's size-dependent factors: tree allreduce's bandwidth x treeCorrectionFactor
// (below 512 MiB), ring/Simple allreduce's latency x the plateau factor (across nodes, from 64
// bytes per channel and rank). 1 where none applies.
struct NcclSizeFactors {
  double bandwidth = 1;
  double latency = 1;
};
NcclSizeFactors nccl_size_factors(const NcclModelInputs& in, NcclColl coll, NcclAlgo algo, NcclProto proto,
                                  double bytes);

// One entry of ncclTopoTuneModel's table (comm->latencies / comm->bandwidths), before size-dependent
// adjustments. enabled == false: NCCL's bandwidth 0 (skipped or disabled); latency and bandwidth 0.
struct NcclTuned {
  NcclAlgo algo;
  NcclProto proto;
  double latency_us;
  double bandwidth_GBps;  // algbw: busbw converted (ring: nRanks/nsteps, tree: 0.5)
  bool enabled;
};
// The six entries for `coll`, in the source's order: tree LL, LL128, Simple; ring LL, LL128, Simple.
std::vector<NcclTuned> nccl_tune_model(const NcclModelInputs& in, NcclColl coll);

// One entry of the cost table for a given size: latency_us includes ring's plateau factor,
// bandwidth_GBps includes tree's correction factor, time_us = latency_us + bytes / (1000 * bandwidth).
// enabled == false: time_us = -1 (the source's "not available"), latency and bandwidth 0.
// A one-rank communicator: only ring/Simple is enabled, with time 0 (and latency, bandwidth 0).
struct NcclEstimate {
  NcclAlgo algo;
  NcclProto proto;
  double latency_us;
  double bandwidth_GBps;  // algbw the model uses
  double time_us;
  bool enabled;
};

// Every (algo, proto) estimate for `bytes` of collective `coll`, in the source's order (tree LL,
// LL128, Simple, ring LL, LL128, Simple). `bytes` is NCCL's nBytes (ncclFuncMaxSendRecvCount x the
// element size): allreduce and broadcast: the buffer; allgather: the gathered output (nRanks x each
// rank's send buffer); reduce-scatter: the input (nRanks x each rank's output).
std::vector<NcclEstimate> nccl_estimates(const NcclModelInputs& in, NcclColl coll, double bytes);

// The one NCCL picks: the smallest time among enabled ones; a tie keeps the earlier in the source's
// order (the comparison is strict), so tree beats ring and LL beats LL128 beats Simple on a tie.
NcclEstimate nccl_choice(const NcclModelInputs& in, NcclColl coll, double bytes);

// The smallest power-of-two size (bytes, from 1 KiB to 1 TiB) at which the choice switches from tree
// (at half that size) to ring for allreduce; 0 when it never switches (e.g. ring wins from 1 KiB).
double nccl_ring_tree_crossover(const NcclModelInputs& in);

}  // namespace lab
