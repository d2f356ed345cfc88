#include "collective_sim.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "communicator.h"
#include "errors.h"
#include "mutation.h"
#include "nccl_model.h"
#include "ring_allreduce.h"
#include "sharded_collectives.h"
#include "tree_allreduce.h"

namespace lab {

const char* sim_collective_name(SimCollective c) {
  switch (c) {
    case SimCollective::Allreduce: return "allreduce";
    case SimCollective::ReduceScatter: return "reduce_scatter";
    case SimCollective::Allgather: return "allgather";
    case SimCollective::Broadcast: return "broadcast";
  }
  return "?";
}
const char* sim_algorithm_name(SimAlgorithm a) {
  switch (a) {
    case SimAlgorithm::Ring: return "ring";
    case SimAlgorithm::Rhd: return "rhd";
    case SimAlgorithm::DbTree: return "dbtree";
    case SimAlgorithm::Hier: return "hier";
  }
  return "?";
}
const char* sim_protocol_name(SimProtocol p) {
  switch (p) {
    case SimProtocol::Wire: return "wire";
    case SimProtocol::Simple: return "simple";
    case SimProtocol::LL128: return "ll128";
    case SimProtocol::LL: return "ll";
  }
  return "?";
}

SimCollective parse_sim_collective(const std::string& s, const std::string& flag) {
  for (auto c : {SimCollective::Allreduce, SimCollective::ReduceScatter, SimCollective::Allgather, SimCollective::Broadcast})
    if (s == sim_collective_name(c)) return c;
  if (s == "all_reduce") return SimCollective::Allreduce;
  if (s == "all_gather") return SimCollective::Allgather;
  throw ConfigError(flag + " " + s + ": one of allreduce, reduce_scatter, allgather, broadcast");
}
SimAlgorithm parse_sim_algorithm(const std::string& s, const std::string& flag) {
  for (auto a : {SimAlgorithm::Ring, SimAlgorithm::Rhd, SimAlgorithm::DbTree, SimAlgorithm::Hier})
    if (s == sim_algorithm_name(a)) return a;
  if (s == "tree")
    throw ConfigError(flag + " tree: ambiguous: dtlab's --allreduce tree is recursive halving-doubling (rhd), "
                      "NCCL's tree is a double binary tree (dbtree)");
  throw ConfigError(flag + " " + s + ": one of ring, rhd, dbtree, hier");
}
SimProtocol parse_sim_protocol(const std::string& s, const std::string& flag) {
  for (auto p : {SimProtocol::Wire, SimProtocol::Simple, SimProtocol::LL128, SimProtocol::LL})
    if (s == sim_protocol_name(p)) return p;
  throw ConfigError(flag + " " + s + ": one of wire, simple, ll128, ll");
}

bool sim_supports(SimAlgorithm a, SimCollective c, int n, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  switch (a) {
    case SimAlgorithm::Ring: return true;
    case SimAlgorithm::Rhd:
      if (c == SimCollective::Broadcast) return no("rhd has no broadcast (dtlab's broadcast is a ring chain)");
      if (c != SimCollective::Allreduce && !tree_collectives_fit(n))
        return no("rhd's " + std::string(sim_collective_name(c)) + " needs a power-of-two world size, not " +
                  std::to_string(n) + " (as dtlab's)");
      return true;
    case SimAlgorithm::DbTree:
      if (c != SimCollective::Allreduce) return no("NCCL's tree runs allreduce only");
      return true;
    case SimAlgorithm::Hier:
      if (c == SimCollective::Broadcast) return no("hier runs allreduce, reduce_scatter and allgather");
      return true;
  }
  return no("?");
}

double busbw_factor(SimCollective c, int n) {
  if (n <= 1) return c == SimCollective::Broadcast ? 1.0 : 0.0;
  switch (c) {
    case SimCollective::Allreduce: return 2.0 * (n - 1) / n;
    case SimCollective::ReduceScatter:
    case SimCollective::Allgather: return static_cast<double>(n - 1) / n;
    case SimCollective::Broadcast: return 1.0;
  }
  return 1.0;
}

NcclColl sim_nccl_coll(SimCollective c) {
  switch (c) {
    case SimCollective::Allreduce: return NcclColl::AllReduce;
    case SimCollective::ReduceScatter: return NcclColl::ReduceScatter;
    case SimCollective::Allgather: return NcclColl::AllGather;
    case SimCollective::Broadcast: return NcclColl::Broadcast;
  }
  return NcclColl::AllReduce;
}

int sim_default_channels(const Topology& t, SimProtocol p) { return p == SimProtocol::Wire ? 1 : 2 * t.nics_per_node; }

NcclModelInputs sim_nccl_inputs(const Topology& t, int channels) {
  NcclModelInputs in;
  in.nodes = t.nodes;
  in.gpus_per_node = t.gpus_per_node;
  in.channels = channels;
  in.bw_intra_GBps = t.intra_GBps;
  in.bw_inter_GBps = t.nics_per_node * t.nic_Gbps / 8;
  in.nvlink = t.nvlink;
  in.cuda_arch = t.cuda_arch;
  return in;
}

int dbtree_parent(int n, int r, int tree) {
  auto btree_parent = [n](int x) {
    if (x == 0) return -1;
    int bit = 1;
    while (bit < n && !(bit & x)) bit <<= 1;
    int up = (x ^ bit) | (bit << 1);
    if (up >= n) up = x ^ bit;
    return up;
  };
  if (tree == 0) return btree_parent(r);
  if (n % 2 == 1) {  // the second tree: the first shifted by one member (n odd) ...
    const int u = btree_parent((r - 1 + n) % n);
    return u == -1 ? -1 : (u + 1) % n;
  }
  const int u = btree_parent(n - 1 - r);  // ... or mirrored (n even)
  return u == -1 ? -1 : n - 1 - u;
}

namespace {

constexpr double kFloat = 4.0;

int mod(int a, int n) { return ((a % n) + n) % n; }

NcclProto nccl_proto(SimProtocol p) {
  switch (p) {
    case SimProtocol::LL: return NcclProto::LL;
    case SimProtocol::LL128: return NcclProto::LL128;
    default: return NcclProto::Simple;
  }
}

// ---- schedules ----

// dtlab's ring allreduce (ring_allreduce_pipelined): chunks of RingChunks{count, N}, G segments
// per chunk, segment j of every chunk through all 2(N-1) steps before segment j+1.
void ring_allreduce_exact(const std::vector<int>& mem, size_t count, SimSchedule& s) {
  const int n = static_cast<int>(mem.size());
  RingChunks ch{count, n};
  const size_t largest = ch.size(0) * sizeof(float);
  const size_t g = std::max<size_t>(1, (largest + kRingSegmentBytes - 1) / kRingSegmentBytes);
  auto seg = [&](int c, size_t j) {
    const size_t sz = ch.size(c);
    return static_cast<double>((sz * (j + 1) / g - sz * j / g) * sizeof(float));
  };
  for (size_t j = 0; j < g; ++j)
    for (int phase = 0; phase < 2; ++phase)
      for (int st = 0; st < n - 1; ++st) {
        SimPhase p;
        p.what = phase == 0 ? "reduce-scatter" : "allgather";
        for (int r = 0; r < n; ++r) {
          const int c = phase == 0 ? mod(r - st, n) : mod(r + 1 - st, n);
          p.messages.push_back({mem[r], mem[(r + 1) % n], seg(c, j), -1});
        }
        s.phases.push_back(std::move(p));
      }
}

// dtlab's ring reduce-scatter / allgather (sharded_collectives.h): N blocks of `block` floats, G
// segments per block (G = ceil(block x 4 / segment)), N-1 steps per segment.
void ring_shard_exact(const std::vector<int>& mem, size_t block, bool gather, SimSchedule& s) {
  const int n = static_cast<int>(mem.size());
  const size_t g = std::max<size_t>(1, (block * sizeof(float) + kShardSegmentBytes - 1) / kShardSegmentBytes);
  for (size_t j = 0; j < g; ++j)
    for (int st = 0; st < n - 1; ++st) {
      SimPhase p;
      p.what = gather ? "allgather" : "reduce-scatter";
      const double b = static_cast<double>((block * (j + 1) / g - block * j / g) * sizeof(float));
      for (int r = 0; r < n; ++r) p.messages.push_back({mem[r], mem[(r + 1) % n], b, -1});
      s.phases.push_back(std::move(p));
    }
}

// One step of a ring over `members` (their ranks in ring order), every member sending `bytes`
// split over `channels` (channel c through NIC c), repeated `steps` times, stepwise or pipelined.
SimPhase ring_phase(const std::vector<int>& members, double bytes, int steps, int channels, bool pipelined,
                    const std::string& what, const Topology& t, int nic_fixed = -1) {
  SimPhase p;
  p.what = what;
  p.pipelined = pipelined;
  const int m = static_cast<int>(members.size());
  const double per = bytes / channels;
  for (int c = 0; c < channels; ++c)
    for (int i = 0; i < m; ++i)
      p.messages.push_back({members[i], members[(i + 1) % m], pipelined ? per * steps : per,
                            nic_fixed >= 0 ? nic_fixed : (channels > 1 ? c : -1)});
  if (pipelined) {
    // the hops a chunk travels: `steps`, of which NCCL counts (nodes - 1) per m - 1 as crossing
    // between nodes (tuning.cc: 2(nNodes - 1) of an allreduce's 2(nRanks - 1), nNodes - 1 of the
    // others' nRanks - 1)
    int nodes_spanned = 1;
    for (int i = 1; i < m; ++i)
      if (members[i] / t.gpus_per_node != members[i - 1] / t.gpus_per_node) ++nodes_spanned;
    p.net_hops = m > 1 ? static_cast<int>(static_cast<int64_t>(steps) * (nodes_spanned - 1) / (m - 1)) : 0;
    p.intra_hops = steps - p.net_hops;
  } else {
    p.repeat = steps;
  }
  return p;
}

std::vector<int> all_ranks(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// dtlab's tree allreduce (tree_allreduce.h), message by message.
void rhd_allreduce_exact(const std::vector<int>& mem, size_t count, SimSchedule& s) {
  const int n = static_cast<int>(mem.size());
  int p = 1;
  while (p * 2 <= n) p *= 2;
  int levels = 0;
  while ((1 << levels) < p) ++levels;
  const int rem = n - p;
  const double whole = static_cast<double>(count) * kFloat;
  if (rem > 0) {
    SimPhase f;
    f.what = "fold-in";
    for (int r = p; r < n; ++r) f.messages.push_back({mem[r], mem[r - p], whole, -1});
    s.phases.push_back(std::move(f));
  }
  if (count * sizeof(float) <= kTreeDoublingBytes) {
    for (int k = 0; k < levels; ++k) {
      const int d = p >> (k + 1);
      SimPhase st;
      st.what = "recursive doubling";
      for (int r = 0; r < p; ++r) st.messages.push_back({mem[r], mem[r ^ d], whole, -1});
      s.phases.push_back(std::move(st));
    }
  } else {
    RingChunks blocks{count, p};
    auto range_bytes = [&](int first, int nblocks) {
      return static_cast<double>(blocks.begin(first + nblocks - 1) + blocks.size(first + nblocks - 1) - blocks.begin(first)) * kFloat;
    };
    for (int k = 0; k < levels; ++k) {
      const int d = p >> (k + 1);
      SimPhase st;
      st.what = "reduce-scatter";
      for (int r = 0; r < p; ++r) {
        const int partner = r ^ d;
        // the partner's half of r's current range (2d blocks from r & ~(2d - 1))
        st.messages.push_back({mem[r], mem[partner], range_bytes(partner & ~(d - 1), d), -1});
      }
      s.phases.push_back(std::move(st));
    }
    for (int k = 0; k < levels; ++k) {
      const int d = 1 << k;
      SimPhase st;
      st.what = "allgather";
      for (int r = 0; r < p; ++r) st.messages.push_back({mem[r], mem[r ^ d], range_bytes(r & ~(d - 1), d), -1});
      s.phases.push_back(std::move(st));
    }
  }
  if (rem > 0) {
    SimPhase f;
    f.what = "fold-out";
    for (int r = p; r < n; ++r) f.messages.push_back({mem[r - p], mem[r], whole, -1});
    s.phases.push_back(std::move(f));
  }
}

// dtlab's tree reduce-scatter / allgather (N a power of two): N blocks of `block` floats.
void rhd_shard(const std::vector<int>& mem, size_t block, bool gather, SimSchedule& s) {
  const int n = static_cast<int>(mem.size());
  int levels = 0;
  while ((1 << levels) < n) ++levels;
  const double b = static_cast<double>(block) * kFloat;
  for (int k = 0; k < levels; ++k) {
    const int d = gather ? (1 << k) : (n >> (k + 1));
    SimPhase st;
    st.what = gather ? "allgather" : "reduce-scatter";
    for (int r = 0; r < n; ++r) st.messages.push_back({mem[r], mem[r ^ d], b * d, -1});
    s.phases.push_back(std::move(st));
  }
}

// NCCL's double binary tree allreduce: two trees over the nodes (dbtree_parent), a chain through
// every node's GPUs per channel (channel c's starts at local GPU c, the node's member of the trees
// on that channel; the next GPU sends up to it, and so on),
// half the data on each tree, each tree on half the channels. Reduce up, then broadcast down:
// every edge carries its tree's half once each way. For a group, `nodes` holds the group's members
// of each node it spans (as many on each), in the order the group meets the nodes: the trees are
// over those nodes, the chains through those members.
void dbtree_allreduce(const std::vector<std::vector<int>>& nodes_of, double bytes, int channels, bool wire,
                      SimSchedule& s) {
  const int nodes = static_cast<int>(nodes_of.size());
  const int g = static_cast<int>(nodes_of[0].size());
  SimPhase p;
  p.what = "tree up + down";
  p.pipelined = true;
  // Each tree runs on every channel (NCCL doubles its channels for the two trees), channel c
  // through NIC c: so every NIC carries one channel of each tree, interior in one, a leaf in the
  // other.
  const int trees = nodes > 1 ? 2 : 1;
  const double per_channel = bytes / trees / channels;
  int depth = 0;
  for (int tr = 0; tr < trees; ++tr) {
    for (int c = 0; c < channels; ++c) {
      const int nic = channels > 1 ? c : -1;
      // channel c's chain starts at local GPU c (the one next to NIC c), so the heads rotate
      const int head = c % g;
      for (int node = 0; node < nodes; ++node) {
        const std::vector<int>& mem = nodes_of[static_cast<size_t>(node)];
        for (int i = 1; i < g; ++i) {
          const int a = mem[(head + i) % g], b = mem[(head + i - 1) % g];
          p.messages.push_back({a, b, per_channel, nic});
          p.messages.push_back({b, a, per_channel, nic});
        }
        if (trees > 1) {
          const int up = dbtree_parent(nodes, node, tr);
          if (up >= 0) {
            const int other = nodes_of[static_cast<size_t>(up)][head];
            p.messages.push_back({mem[head], other, per_channel, nic});
            p.messages.push_back({other, mem[head], per_channel, nic});
          }
        }
      }
    }
    if (trees > 1)
      for (int node = 0; node < nodes; ++node) {
        int d = 0;
        for (int x = node; dbtree_parent(nodes, x, tr) >= 0; x = dbtree_parent(nodes, x, tr)) ++d;
        depth = std::max(depth, d);
      }
  }
  p.intra_hops = 2 * (g - 1);
  p.net_hops = 2 * depth;
  p.fill_bytes = wire ? std::min<double>(per_channel, kRingSegmentBytes) : 0;
  s.phases.push_back(std::move(p));
}

// A group's members by node: one list per node the group spans, in the order the group first meets
// each node, each list in group order.
std::vector<std::vector<int>> members_by_node(const Topology& t, const std::vector<int>& members) {
  std::vector<std::vector<int>> out;
  std::unordered_map<int, size_t> index;
  for (int m : members) {
    const int node = m / t.gpus_per_node;
    auto it = index.find(node);
    if (it == index.end()) {
      it = index.emplace(node, out.size()).first;
      out.emplace_back();
    }
    out[it->second].push_back(m);
  }
  return out;
}

void check_members(const Topology& t, const std::vector<int>& members) {
  const int n = t.ranks();
  if (members.empty()) throw ConfigError("a group collective needs at least one member");
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (int m : members) {
    if (m < 0 || m >= n)
      throw ConfigError("group member " + std::to_string(m) + " is not a rank of " + t.name + " (" +
                        std::to_string(n) + " ranks)");
    if (seen[static_cast<size_t>(m)]++) throw ConfigError("group member " + std::to_string(m) + " appears twice");
  }
}

}  // namespace

SimSchedule sim_schedule(const Topology& t, const SimOptions& o, uint64_t bytes) {
  return sim_schedule_group(t, o, bytes, all_ranks(t.ranks()));
}

SimSchedule sim_schedule_group(const Topology& t, const SimOptions& o, uint64_t bytes, const std::vector<int>& members) {
  check_members(t, members);
  const int n = static_cast<int>(members.size());
  std::string why;
  if (!sim_supports(o.algorithm, o.collective, n, &why))
    throw ConfigError(std::string("--algorithm ") + sim_algorithm_name(o.algorithm) + " with --collective " +
                      sim_collective_name(o.collective) + ": " + why);
  SimSchedule s;
  const bool wire = o.protocol == SimProtocol::Wire;
  const int channels = o.channels > 0 ? o.channels : sim_default_channels(t, o.protocol);
  const size_t count = bytes / sizeof(float);
  const double S = static_cast<double>(count) * kFloat;
  if (n == 1) return s;
  const std::vector<int>& everyone = members;
  const std::vector<std::vector<int>> per_node = members_by_node(t, members);
  if (o.algorithm == SimAlgorithm::DbTree || o.algorithm == SimAlgorithm::Hier)
    for (const auto& l : per_node)
      if (l.size() != per_node[0].size())
        throw ConfigError(std::string("--algorithm ") + sim_algorithm_name(o.algorithm) +
                          ": the group has " + std::to_string(per_node[0].size()) + " members on one node and " +
                          std::to_string(l.size()) + " on another (it needs as many on every node it spans)");
  switch (o.algorithm) {
    case SimAlgorithm::Ring: {
      if (o.collective == SimCollective::Broadcast) {
        // a chain from rank 0 (Communicator::broadcast: 1 MiB segments, pipelined)
        SimPhase p = ring_phase(everyone, S, 1, channels, true, "broadcast chain", t);
        p.messages.erase(std::remove_if(p.messages.begin(), p.messages.end(),
                                        [&](const SimMessage& m) { return m.src == everyone[n - 1]; }),
                         p.messages.end());
        p.net_hops = static_cast<int>(per_node.size()) - 1;
        p.intra_hops = n - 1 - p.net_hops;
        if (wire) {
          p.fill_bytes = std::min<double>(S, double(kBroadcastSegmentBytes));
          if (o.exact) {  // the segments' messages, counted
            const size_t seg = kBroadcastSegmentBytes;
            const size_t segments = count == 0 ? 1 : (static_cast<size_t>(S) + seg - 1) / seg;
            p.messages.clear();
            for (size_t k = 0; k < segments; ++k)
              for (int r = 0; r + 1 < n; ++r)
                p.messages.push_back({everyone[r], everyone[r + 1], std::min<double>(double(seg), S - double(k * seg)) * (count > 0), -1});
          }
        }
        s.phases.push_back(std::move(p));
        break;
      }
      if (o.collective == SimCollective::Allreduce) {
        if (wire && o.exact) {
          ring_allreduce_exact(everyone, count, s);
        } else if (wire) {
          RingChunks ch{count, n};
          const size_t largest = ch.size(0) * sizeof(float);
          const size_t g = std::max<size_t>(1, (largest + kRingSegmentBytes - 1) / kRingSegmentBytes);
          const double seg = static_cast<double>((ch.size(0) + g - 1) / g) * kFloat;
          SimPhase p = ring_phase(everyone, seg, 2 * (n - 1), 1, false, "reduce-scatter + allgather", t);
          p.repeat *= static_cast<int64_t>(g);
          s.phases.push_back(std::move(p));
        } else {
          s.phases.push_back(ring_phase(everyone, S / n, 2 * (n - 1), channels, true, "reduce-scatter + allgather", t));
        }
        break;
      }
      const bool gather = o.collective == SimCollective::Allgather;
      const size_t block = count / n;
      if (wire && o.exact) {
        ring_shard_exact(everyone, block, gather, s);
      } else if (wire) {
        const size_t g = std::max<size_t>(1, (block * sizeof(float) + kShardSegmentBytes - 1) / kShardSegmentBytes);
        SimPhase p = ring_phase(everyone, static_cast<double>((block + g - 1) / g) * kFloat, n - 1, 1, false,
                                gather ? "allgather" : "reduce-scatter", t);
        p.repeat *= static_cast<int64_t>(g);
        s.phases.push_back(std::move(p));
      } else {
        s.phases.push_back(ring_phase(everyone, static_cast<double>(block) * kFloat, n - 1, channels, true,
                                      gather ? "allgather" : "reduce-scatter", t));
      }
      break;
    }
    case SimAlgorithm::Rhd:
      if (o.collective == SimCollective::Allreduce)
        rhd_allreduce_exact(everyone, count, s);
      else
        rhd_shard(everyone, count / n, o.collective == SimCollective::Allgather, s);
      break;
    case SimAlgorithm::DbTree:
      dbtree_allreduce(per_node, S, channels, wire, s);
      break;
    case SimAlgorithm::Hier: {
      const int g = static_cast<int>(per_node[0].size()), nodes = static_cast<int>(per_node.size());
      const bool pipelined = !wire;
      auto intra = [&](double per_step, const std::string& what) {
        SimPhase p;
        p.what = what;
        p.pipelined = pipelined;
        for (int node = 0; node < nodes; ++node) {
          SimPhase q = ring_phase(per_node[static_cast<size_t>(node)], per_step, g - 1, pipelined ? channels : 1,
                                  pipelined, what, t);
          p.messages.insert(p.messages.end(), q.messages.begin(), q.messages.end());
          p.repeat = q.repeat;
          p.intra_hops = q.intra_hops;
        }
        if (g > 1) s.phases.push_back(std::move(p));
      };
      auto inter = [&](double per_step, int steps, const std::string& what) {
        SimPhase p;
        p.what = what;
        p.pipelined = pipelined;
        for (int l = 0; l < g; ++l) {
          std::vector<int> ring(static_cast<size_t>(nodes));
          for (int node = 0; node < nodes; ++node) ring[static_cast<size_t>(node)] = per_node[static_cast<size_t>(node)][l];
          // the ring of the GPUs of local index ring[0] % gpus_per_node, through that index's NIC
          SimPhase q = ring_phase(ring, per_step, steps, 1, pipelined, what, t,
                                  (ring[0] % t.gpus_per_node) % t.nics_per_node);
          p.messages.insert(p.messages.end(), q.messages.begin(), q.messages.end());
          p.repeat = q.repeat;
          p.net_hops = q.net_hops;
          p.intra_hops = q.intra_hops;
        }
        if (nodes > 1) s.phases.push_back(std::move(p));
      };
      const double per_gpu = S / g;    // what each GPU holds after the intra-node reduce-scatter
      const double per_rank = S / n;   // a rank's final share
      switch (o.collective) {
        case SimCollective::Allreduce:
          intra(per_gpu, "node reduce-scatter");
          inter(per_gpu / nodes, 2 * (nodes - 1), "cross-node allreduce");
          intra(per_gpu, "node allgather");
          break;
        case SimCollective::ReduceScatter:
          intra(per_gpu, "node reduce-scatter");
          inter(per_rank, nodes - 1, "cross-node reduce-scatter");
          break;
        case SimCollective::Allgather:
          inter(per_rank, nodes - 1, "cross-node allgather");
          intra(per_gpu, "node allgather");
          break;
        case SimCollective::Broadcast:
          break;
      }
      break;
    }
  }
  return s;
}


namespace {

// The resources of a topology, numbered: GPU links out [0, N), in [N, 2N); NICs out, NICs in;
// leaf uplinks out, in. Resources from 2N on are shared by several GPUs.
struct Resources {
  const Topology& t;
  int n, k, nodes, per_group, leaf_ids;
  std::vector<double> bw;
  Resources(const Topology& top, double factor, double gpu_cap) : t(top) {
    n = t.ranks();
    k = t.nics_per_node;
    nodes = t.nodes;
    per_group = t.rails ? k : 1;
    leaf_ids = t.leaves() * per_group;
    bw.assign(static_cast<size_t>(2 * n + 2 * nodes * k + 2 * leaf_ids), 0.0);
    for (int i = 0; i < 2 * n; ++i) bw[i] = std::min(t.intra_bytes_per_s() * factor, gpu_cap);
    for (int i = 0; i < 2 * nodes * k; ++i) bw[2 * n + i] = t.nic_bytes_per_s() * factor;
    for (int i = 0; i < 2 * leaf_ids; ++i) bw[2 * n + 2 * nodes * k + i] = t.uplink_bytes_per_s() * factor;
  }
  bool shared(int res) const { return res >= 2 * n; }
  // The path of a message; returns whether it leaves its node.
  bool path(const SimMessage& m, int out[6], int& len) const {
    const int g = t.gpus_per_node;
    const int ns = m.src / g, nd = m.dst / g;
    len = 0;
    out[len++] = m.src;
    if (ns == nd) {
      out[len++] = n + m.dst;
      return false;
    }
    const int ko = (m.nic >= 0 ? m.nic : m.src % g) % k;
    const int ki = (m.nic >= 0 ? m.nic : m.dst % g) % k;
    out[len++] = 2 * n + ns * k + ko;
    const int npl = t.nodes_per_leaf > 0 ? t.nodes_per_leaf : nodes;
    const int ls = (ns / npl) * per_group + (t.rails ? ko : 0);
    const int ld = (nd / npl) * per_group + (t.rails ? ki : 0);
    if (ls != ld) {
      out[len++] = 2 * n + 2 * nodes * k + ls;
      out[len++] = 2 * n + 2 * nodes * k + leaf_ids + ld;
    }
    out[len++] = 2 * n + nodes * k + nd * k + ki;
    out[len++] = n + m.dst;
    return true;
  }
};

struct PhaseTime {
  double time = 0, latency = 0, bandwidth = 0;
};

// The loads of a set of messages and the makespan over them: `with` = every resource's load,
// `alone` = shared resources charged only with the sender's own bytes.
PhaseTime phase_time(const Resources& res, const SimPhase& p, double lat_intra, double lat_net) {
  // every message's path once; the loads; and `own`: for each (message, hop) on a shared resource,
  // the bytes its sender puts on that resource (each sum taken in message order)
  const size_t count = p.messages.size();
  std::vector<int> paths(count * 6);
  std::vector<unsigned char> lens(count);
  std::vector<char> nets(count);
  std::vector<double> load(res.bw.size(), 0.0);
  // the hops on shared resources, as (resource - 2N, message x 6 + hop), in message order
  std::vector<std::pair<int, uint32_t>> on_shared;
  for (size_t j = 0; j < count; ++j) {
    const SimMessage& m = p.messages[j];
    int* path = &paths[j * 6];
    int len = 0;
    nets[j] = res.path(m, path, len) ? 1 : 0;
    lens[j] = static_cast<unsigned char>(len);
    for (int i = 0; i < len; ++i) {
      load[path[i]] += m.bytes;
      if (res.shared(path[i])) on_shared.push_back({path[i] - 2 * res.n, static_cast<uint32_t>(j * 6 + i)});
    }
  }
  // grouped by resource (a counting sort: stable, so message order within a resource), then summed
  // per sender in that order
  const size_t shared = res.bw.size() - static_cast<size_t>(2 * res.n);
  std::vector<uint32_t> first(shared + 1, 0);
  for (const auto& h : on_shared) ++first[static_cast<size_t>(h.first) + 1];
  for (size_t r = 0; r < shared; ++r) first[r + 1] += first[r];
  std::vector<uint32_t> by_resource(on_shared.size());
  {
    std::vector<uint32_t> next(first.begin(), first.end() - 1);
    for (const auto& h : on_shared) by_resource[next[static_cast<size_t>(h.first)]++] = h.second;
  }
  std::vector<double> own(count * 6, 0.0), sum(static_cast<size_t>(res.n), 0.0);
  for (size_t r = 0; r < shared; ++r) {
    for (uint32_t k = first[r]; k < first[r + 1]; ++k) {
      const SimMessage& m = p.messages[by_resource[k] / 6];
      sum[static_cast<size_t>(m.src)] += m.bytes;
    }
    for (uint32_t k = first[r]; k < first[r + 1]; ++k) own[by_resource[k]] = sum[static_cast<size_t>(p.messages[by_resource[k] / 6].src)];
    for (uint32_t k = first[r]; k < first[r + 1]; ++k) sum[static_cast<size_t>(p.messages[by_resource[k] / 6].src)] = 0;
  }
  PhaseTime out;
  if (p.pipelined) {
    double full = 0, alone = 0, min_bw = 1e300;
    for (size_t j = 0; j < count; ++j) {
      const int* path = &paths[j * 6];
      for (int i = 0; i < lens[j]; ++i) {
        const double b = res.bw[path[i]];
        min_bw = std::min(min_bw, b);
        full = std::max(full, load[path[i]] / b);
        const double mine = res.shared(path[i]) ? own[j * 6 + i] : load[path[i]];
        alone = std::max(alone, mine / b);
      }
    }
    const double hops = p.intra_hops + p.net_hops;
    const double fill = hops > 1 && p.fill_bytes > 0 && min_bw < 1e300 ? (hops - 1) * p.fill_bytes / min_bw : 0.0;
    out.latency = p.intra_hops * lat_intra + p.net_hops * lat_net;
    out.bandwidth = alone + fill;
    out.time = out.latency + full + fill;
    return out;
  }
  double best_full = 0, best_alone = 0, lat_of_alone = 0;
  for (size_t j = 0; j < count; ++j) {
    const int* path = &paths[j * 6];
    const double lat = nets[j] ? lat_net : lat_intra;
    double full = 0, alone = 0;
    for (int i = 0; i < lens[j]; ++i) {
      const double b = res.bw[path[i]];
      full = std::max(full, load[path[i]] / b);
      const double mine = res.shared(path[i]) ? own[j * 6 + i] : load[path[i]];
      alone = std::max(alone, mine / b);
    }
    best_full = std::max(best_full, lat + full);
    if (lat + alone > best_alone) {
      best_alone = lat + alone;
      lat_of_alone = lat;
    }
  }
  out.time = best_full * static_cast<double>(p.repeat);
  out.latency = lat_of_alone * static_cast<double>(p.repeat);
  out.bandwidth = (best_alone - lat_of_alone) * static_cast<double>(p.repeat);
  return out;
}

}  // namespace

namespace {

// What NCCL's model sees of a group: the nodes it spans and its members per node (the most on any
// node), and its size. For the whole world: the topology's nodes and GPUs per node.
struct GroupShape {
  int nodes = 1, per_node = 1, ranks = 1;
};

GroupShape shape_of(const Topology& t, const std::vector<std::vector<int>>& groups) {
  GroupShape g;
  for (const auto& members : groups) {
    const auto per_node = members_by_node(t, members);
    g.nodes = std::max(g.nodes, static_cast<int>(per_node.size()));
    for (const auto& l : per_node) g.per_node = std::max(g.per_node, static_cast<int>(l.size()));
    g.ranks = std::max(g.ranks, static_cast<int>(members.size()));
  }
  return g;
}

SimResult time_of(const Topology& t, const SimOptions& o, const SimSchedule& s, uint64_t bytes, const GroupShape& gs) {
  double factor = 1.0, cap = HUGE_VAL, base = 0;
  double lat_intra = t.intra_latency_us * 1e-6, lat_net = t.net_latency_us * 1e-6;
  if (o.protocol != SimProtocol::Wire) {
    // NCCL's costs for the protocol: its latencies, and its bandwidth factor and cap on every
    // GPU's link (the cap is on NCCL's bus bandwidth, which a GPU's link carries). NCCL's model
    // is given the group's shape (a group's communicator spans its own nodes).
    Topology shape = t;
    shape.nodes = gs.nodes;
    shape.gpus_per_node = gs.per_node;
    const NcclAlgo algo = o.algorithm == SimAlgorithm::DbTree ? NcclAlgo::Tree : NcclAlgo::Ring;
    const int channels = o.channels > 0 ? o.channels : sim_default_channels(t, o.protocol);
    const NcclModelInputs in = sim_nccl_inputs(shape, channels);
    const NcclProtocolCosts c = nccl_protocol_costs(in, algo, nccl_proto(o.protocol));
    // and NCCL's measured size factors (tree's pipeline at middle sizes, the ring's plateau)
    const NcclSizeFactors f = nccl_size_factors(in, sim_nccl_coll(o.collective), algo, nccl_proto(o.protocol),
                                                static_cast<double>(bytes));
    factor = c.bus_factor * f.bandwidth;
    cap = c.bus_cap_GBps * f.bandwidth * 1e9;
    base = c.base_us * f.latency * 1e-6;
    lat_intra = (algo == NcclAlgo::Ring ? c.ring_intra_hop_us : c.intra_hop_us) * f.latency * 1e-6;
    lat_net = c.inter_hop_us * f.latency * 1e-6;
  }
  if (mutated("sim-no-latency")) base = lat_intra = lat_net = 0;  // a lesson's mutation test (mutation.h)
  Resources res(t, factor, cap);
  SimResult r;
  r.latency_s = base;
  r.time_s = base;
  for (const auto& p : s.phases) {
    const PhaseTime pt = phase_time(res, p, lat_intra, lat_net);
    r.time_s += pt.time;
    r.latency_s += pt.latency;
    r.bandwidth_s += pt.bandwidth;
    r.steps += p.pipelined ? p.intra_hops + p.net_hops : p.repeat;
  }
  r.contention_s = r.time_s - r.latency_s - r.bandwidth_s;
  if (r.contention_s < 1e-9 * r.time_s) r.contention_s = 0;  // rounding, not contention
  const double S = static_cast<double>(bytes / sizeof(float)) * kFloat;
  r.algbw = r.time_s > 0 ? S / r.time_s : 0;
  r.busbw = r.algbw * busbw_factor(o.collective, gs.ranks);
  return r;
}

}  // namespace

SimResult sim_time(const Topology& t, const SimOptions& o, const SimSchedule& s, uint64_t bytes) {
  return time_of(t, o, s, bytes, {t.nodes, t.gpus_per_node, t.ranks()});
}

SimResult simulate_collective(const Topology& t, const SimOptions& o, uint64_t bytes) {
  return sim_time(t, o, sim_schedule(t, o, bytes), bytes);
}

SimSchedule sim_schedule_groups(const Topology& t, const SimOptions& o, uint64_t bytes,
                                const std::vector<std::vector<int>>& groups) {
  std::vector<char> seen(static_cast<size_t>(t.ranks()), 0);
  SimSchedule all;
  for (const auto& members : groups) {
    for (int m : members)
      if (m >= 0 && m < t.ranks() && seen[static_cast<size_t>(m)]++)
        throw ConfigError("rank " + std::to_string(m) + " is in two of the groups of one collective");
    SimSchedule one = sim_schedule_group(t, o, bytes, members);
    // phase k of every group runs beside phase k of the others (the groups have the same shape)
    for (size_t k = 0; k < one.phases.size(); ++k) {
      if (k >= all.phases.size()) {
        all.phases.push_back(std::move(one.phases[k]));
        continue;
      }
      SimPhase& p = all.phases[k];
      SimPhase& q = one.phases[k];
      p.messages.insert(p.messages.end(), q.messages.begin(), q.messages.end());
      p.repeat = std::max(p.repeat, q.repeat);
      p.intra_hops = std::max(p.intra_hops, q.intra_hops);
      p.net_hops = std::max(p.net_hops, q.net_hops);
      p.fill_bytes = std::max(p.fill_bytes, q.fill_bytes);
    }
  }
  return all;
}

SimResult sim_time_groups(const Topology& t, const SimOptions& o, const SimSchedule& s, uint64_t bytes,
                          const std::vector<std::vector<int>>& groups) {
  return time_of(t, o, s, bytes, shape_of(t, groups));
}

SimResult simulate_group_collective(const Topology& t, const SimOptions& o, uint64_t bytes,
                                    const std::vector<int>& members) {
  return simulate_groups_collective(t, o, bytes, {members});
}

SimResult simulate_groups_collective(const Topology& t, const SimOptions& o, uint64_t bytes,
                                     const std::vector<std::vector<int>>& groups) {
  return sim_time_groups(t, o, sim_schedule_groups(t, o, bytes, groups), bytes, groups);
}

SimResult simulate_messages(const Topology& t, const SimOptions& o, const std::vector<SimMessage>& messages) {
  SimSchedule s;
  if (messages.empty()) return SimResult{};
  SimPhase p;
  p.what = "point-to-point";
  p.messages = messages;
  double largest = 0;
  GroupShape gs{1, 1, 2};
  for (const SimMessage& m : messages) {
    if (m.src < 0 || m.src >= t.ranks() || m.dst < 0 || m.dst >= t.ranks())
      throw ConfigError("a message from " + std::to_string(m.src) + " to " + std::to_string(m.dst) + ": not ranks of " +
                        t.name + " (" + std::to_string(t.ranks()) + " ranks)");
    largest = std::max(largest, m.bytes);
    if (m.src / t.gpus_per_node != m.dst / t.gpus_per_node) gs.nodes = 2;
  }
  s.phases.push_back(std::move(p));
  SimOptions so = o;
  so.algorithm = SimAlgorithm::Ring;
  so.collective = SimCollective::Broadcast;  // (NCCL's size factors: none apply to a send)
  SimResult r = time_of(t, so, s, static_cast<uint64_t>(largest), gs);
  r.busbw = r.algbw;
  return r;
}

double sim_network_bytes(const Topology& t, const SimSchedule& s) {
  double b = 0;
  for (const auto& p : s.phases)
    for (const auto& m : p.messages)
      if (m.src / t.gpus_per_node != m.dst / t.gpus_per_node) b += m.bytes * static_cast<double>(p.repeat);
  return b;
}

SimTraffic sim_traffic(const SimSchedule& s, int ranks) {
  SimTraffic tr;
  tr.sent.assign(ranks, 0.0);
  tr.messages.assign(ranks, 0);
  for (const auto& p : s.phases)
    for (const auto& m : p.messages) {
      tr.sent[m.src] += m.bytes * static_cast<double>(p.repeat);
      tr.messages[m.src] += p.repeat;
    }
  return tr;
}

}  // namespace lab
