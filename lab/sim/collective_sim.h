// Collectives at scale, simulated: which messages an algorithm sends (a schedule), and how long
// they take on a Topology (topology.h), split into latency, bandwidth and contention.
//
// Words:
//   S          the collective's size in bytes, as nccl-tests gives it: the buffer of an allreduce
//              or a broadcast, the input of a reduce-scatter, the output of an allgather (so every
//              rank contributes or keeps S/N of the last two). Counted in whole floats.
//   step       every rank sends at most a few messages, then waits for what it receives.
//   channel    NCCL splits a collective over several rings or trees, each through its own NIC;
//              dtlab's own algorithms run one.
//
// Groups. A collective may run over a subset of the topology's ranks (a process group: a tensor-
// parallel group inside a node, a data-parallel group with a stride across nodes), with the same
// schedules over its members: ring over the members in the group's order (broadcast: a chain from
// the first member); rhd over the members as ranks 0 .. n-1; dbtree over the nodes the members
// span, in the order the group meets them, with a chain through each node's members; hier with
// the members of each node as its GPUs (dbtree and hier need as many members on every node). Several
// groups may run the same collective at once (every data-parallel group of a grid): their messages
// share the links, NICs and uplinks, so the time includes their contention. NCCL's protocols price a
// group as its own communicator: the nodes it spans and its members per node. The whole-world
// functions are the special case of one group of every rank, 0 .. N-1.
//
// Algorithms (SimAlgorithm):
//   ring    the flat ring over ranks 0 .. N-1 (NCCL builds flat rings only): allreduce =
//           reduce-scatter + allgather, 2(N-1) steps; reduce-scatter and allgather N-1 steps;
//           broadcast a pipelined chain from rank 0. Under the wire protocol, exactly dtlab's
//           ring (ring_allreduce.h, sharded_collectives.h, Communicator::broadcast): its chunks
//           (uneven where N does not divide the count), its segments (each segment through all
//           the steps before the next), its 0-byte messages.
//   rhd     recursive halving-doubling, what dtlab's `--allreduce tree` runs (tree_allreduce.h):
//           its fold for N not a power of two and its recursive doubling up to 64 KiB, exactly;
//           reduce-scatter and allgather for N a power of two; no broadcast.
//   dbtree  NCCL's double binary tree (allreduce only, as NCCL): two binary trees over the nodes,
//           each a leaf where the other is interior, each carrying half the data, and a chain
//           through the GPUs of every node; reduce up, broadcast down, pipelined.
//   hier    hierarchical (2D): reduce-scatter inside every node, a ring over the nodes between
//           GPUs of the same local index (each through its own NIC), allgather inside every node.
//
// Protocols (SimProtocol):
//   wire    the link's own latency and bandwidth (the topology's), as the emulated link model
//           (link_model.h) times dtlab's ranks: steps wait for each other; no base latency.
//   simple, ll128, ll   NCCL's protocols: its base and per-hop latencies and its bandwidth
//           factors (nccl_model.h, NCCL 2.30.7), and NCCL's pipelining: a collective's steps
//           overlap, so its time is the latency of its hops plus its busiest resource's bytes
//           over that resource's bandwidth.
//
// The time model. Every message crosses a path of resources (topology.h: a GPU's link out and
// in, NICs, leaf uplinks), each with its own bandwidth. Stepwise (wire): a step takes the longest
// of (its message's latency + the busiest resource on its path's bytes / bandwidth), and steps add
// up. Pipelined (NCCL's protocols): latency of the hops on the longest path + the busiest
// resource's bytes over the whole collective / bandwidth. The split: `latency` is the latency
// part, `bandwidth` the time the messages would take if no two ranks shared a NIC or an uplink,
// `contention` the rest (time lost to shared NICs and uplinks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nccl_model.h"
#include "topology.h"

namespace lab {

enum class SimCollective { Allreduce, ReduceScatter, Allgather, Broadcast };
enum class SimAlgorithm { Ring, Rhd, DbTree, Hier };
enum class SimProtocol { Wire, Simple, LL128, LL };

const char* sim_collective_name(SimCollective c);  // allreduce, reduce_scatter, allgather, broadcast
const char* sim_algorithm_name(SimAlgorithm a);    // ring, rhd, dbtree, hier
const char* sim_protocol_name(SimProtocol p);      // wire, simple, ll128, ll
// Parse a name; throws ConfigError naming `flag`, the value and the choices. "tree" is refused
// with a hint: dtlab's tree is rhd, NCCL's is dbtree.
SimCollective parse_sim_collective(const std::string& s, const std::string& flag = "--collective");
SimAlgorithm parse_sim_algorithm(const std::string& s, const std::string& flag = "--algorithm");
SimProtocol parse_sim_protocol(const std::string& s, const std::string& flag = "--protocol");
// Whether the algorithm runs this collective on n ranks; `why` says why not.
bool sim_supports(SimAlgorithm a, SimCollective c, int n, std::string* why = nullptr);
// nccl-tests' factor from algbw to busbw: 2(N-1)/N allreduce, (N-1)/N reduce-scatter and
// allgather, 1 broadcast.
double busbw_factor(SimCollective c, int n);

struct SimMessage {
  int src = 0;
  int dst = 0;
  double bytes = 0;
  int nic = -1;  // the channel's NIC index between nodes; -1: the sender's local index out, the receiver's in
};

struct SimPhase {
  std::string what;               // "reduce-scatter", "allgather", "fold-in", "tree", ...
  bool pipelined = false;         // false: `messages` is one step, taken `repeat` times
  std::vector<SimMessage> messages;
  int64_t repeat = 1;
  // pipelined: the hops on the longest path, and the unit that fills the pipeline (0: none)
  int intra_hops = 0;
  int net_hops = 0;
  double fill_bytes = 0;
};

struct SimSchedule {
  std::vector<SimPhase> phases;
};

// Channels when SimOptions::channels is 0: one under wire (dtlab's algorithms run one), else two
// per NIC, as NCCL's search finds on rail-optimized nodes (16 on a DGX H100).
int sim_default_channels(const Topology& t, SimProtocol p);
// The collective as nccl_model.h names it.
NcclColl sim_nccl_coll(SimCollective c);
// What NCCL's topology search would report for this topology (nccl_model.h's inputs): the GPUs'
// link as bw_intra, the node's NICs together as bw_inter, its architecture and link kind.
NcclModelInputs sim_nccl_inputs(const Topology& t, int channels);

struct SimOptions {
  SimCollective collective = SimCollective::Allreduce;
  SimAlgorithm algorithm = SimAlgorithm::Ring;
  SimProtocol protocol = SimProtocol::Simple;
  int channels = 0;      // 0: sim_default_channels
  bool exact = false;    // every step as it is (bytes per rank exact); else uniform steps once, repeated
};

// The messages of one collective of S bytes. Throws ConfigError where the algorithm does not run
// the collective on this many ranks (sim_supports).
SimSchedule sim_schedule(const Topology& t, const SimOptions& o, uint64_t bytes);

struct SimResult {
  double time_s = 0;
  double latency_s = 0;
  double bandwidth_s = 0;
  double contention_s = 0;
  double algbw = 0;         // bytes per second: S / time
  double busbw = 0;         // algbw x busbw_factor
  int64_t steps = 0;        // steps (stepwise) or hops (pipelined), over all phases
};
SimResult sim_time(const Topology& t, const SimOptions& o, const SimSchedule& s, uint64_t bytes);
SimResult simulate_collective(const Topology& t, const SimOptions& o, uint64_t bytes);

// Groups (above): one group's schedule over `members` (world ranks, in the group's order), and the
// schedule of several groups running the same collective at once (phase k of each beside the
// others'). Throws ConfigError for a member out of range or repeated (a rank in two groups), or a
// dbtree or hier group with unequal members per node. A group of all ranks in order is
// sim_schedule's schedule, message for message.
SimSchedule sim_schedule_group(const Topology& t, const SimOptions& o, uint64_t bytes, const std::vector<int>& members);
SimSchedule sim_schedule_groups(const Topology& t, const SimOptions& o, uint64_t bytes,
                                const std::vector<std::vector<int>>& groups);
// The time of a groups' schedule: NCCL's latencies for the groups' shape (the nodes a group spans,
// its members per node), busbw with the group's size.
SimResult sim_time_groups(const Topology& t, const SimOptions& o, const SimSchedule& s, uint64_t bytes,
                          const std::vector<std::vector<int>>& groups);
SimResult simulate_group_collective(const Topology& t, const SimOptions& o, uint64_t bytes, const std::vector<int>& members);
SimResult simulate_groups_collective(const Topology& t, const SimOptions& o, uint64_t bytes,
                                     const std::vector<std::vector<int>>& groups);
// Point-to-point messages sent at once (a pipeline's activations between stages): one step, each
// message over its path, sharing the resources it crosses; under NCCL's protocols a send pays the
// protocol's base latency and the hop's (o's algorithm and collective are ignored).
SimResult simulate_messages(const Topology& t, const SimOptions& o, const std::vector<SimMessage>& messages);
// Bytes of a schedule's messages between nodes (through NICs), every repeat counted.
double sim_network_bytes(const Topology& t, const SimSchedule& s);

// Per rank: bytes sent and messages sent (0-byte ones too) by a schedule; exact only for
// schedules built with exact = true.
struct SimTraffic {
  std::vector<double> sent;
  std::vector<int64_t> messages;
};
SimTraffic sim_traffic(const SimSchedule& s, int ranks);

// NCCL's double binary tree over n members (after NCCL's src/graph/trees.cc): the parent of
// member r in tree 0 or 1 (-1 for the root).
int dbtree_parent(int n, int r, int tree);

}  // namespace lab
