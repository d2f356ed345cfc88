// LinkModelWorld: a simulated network between emulated ranks (--link-latency-us, --link-gbps,
// the nodes' NICs: --link-gpus-per-node, --link-nic-gbps, --link-nic-latency-us, --link-nics-per-node,
// and the leaf switches' uplinks: --link-nodes-per-leaf, --link-oversubscription).
// It decorates any World whose ranks all live in this process: every rank's Transport is wrapped
// so that each message completes no earlier than the model says, and the collectives above it
// (ring allreduce, the naive allreduce, broadcast chains, DataParallel's scatter, replicate, gather
// and reduce) take the time they would on such a network, while the data still moves through the
// wrapped transport.
//
// The model: a switch. Every rank has ONE full-duplex link to a switch that connects any two
// ranks without delay of its own: a link out (rank -> switch) and a link in (switch -> rank), each
// carrying `bandwidth` bytes per second. A message of b bytes from src to dst needs src's link out
// and dst's link in, both at once, for b / bandwidth, and arrives `latency` after its last byte:
//   start   = the earliest time >= max(posted, end of the previous message src -> dst) at which
//             every link on the message's path is free for b / bandwidth
//   leave   = start + b / bandwidth
//   arrival = leave + latency
// So what a rank sends leaves through its one link out, one message after another: a rank that
// sends a buffer to N-1 others pays N-1 message times whether it posts them at once or in turn
// (the master bottleneck of a parameter server or of DataParallel's device 0); what it receives
// comes in one message after another; sending and receiving overlap (full duplex), so a ring step,
// where every rank sends to one neighbour and receives from the other, takes one message time.
// Messages are placed in the order they are posted (under one lock); a message may use a gap that
// messages placed before it left on both its links, but never overtakes an earlier message
// between the same two ranks. A message of 0 bytes occupies no link: it arrives `latency` after
// it was posted (or after the previous message between the same two ranks). This is the whole
// network by default; with nodes (below) it is each node's own switch, and the nodes meet
// through their NICs.
//
// Resources. A message's path is a list of resources (each with its own bandwidth
// and its own timetable); on the switch the path is {src's link out, dst's link in}. A resource
// that several ranks share (a NIC, a leaf's uplink to the spine) is one more entry on the paths
// that cross it, with its own bandwidth: the message then occupies its whole path at the slowest
// resource's rate. A link or a NIC carries one message at a time; an uplink several, up to its
// bandwidth (Leaves, below). LinkTimetable::path() is the one place that says which resources a
// message crosses.
//
// Nodes (--link-gpus-per-node G, --link-nic-gbps, --link-nic-latency-us, --link-nics-per-node K):
// the ranks sit on nodes of G ranks each, placed in order (node = rank / G, local rank = rank % G;
// the world size must be a multiple of G). Within a node every rank keeps its full-duplex link
// (`bandwidth`, `latency`) to the node's switch, as above. Every node has K NICs, each full duplex
// with `nic bandwidth` in each direction: a NIC out (node -> network) and a NIC in (network ->
// node). The network between the nodes adds no delay of its own. Rank i of a node sends and
// receives through the node's NIC i % K (rail-like: GPU i uses NIC i % K). So:
//   same node:      path = {src's link out, dst's link in}
//                   bytes pass at `bandwidth`, arrival = leave + latency
//   between nodes:  path = {src's link out, NIC out (src's node, local(src) % K),
//                           NIC in (dst's node, local(dst) % K), dst's link in}
//                   bytes pass at min(bandwidth, nic bandwidth) (the slowest resource),
//                   arrival = leave + latency + nic latency
// and the message holds all four resources at once for its whole length (start and leave as
// above, with the path's rate: a slow NIC also holds the sender's link out and the receiver's link
// in for as long as it takes). An empty message occupies nothing and arrives the path's latency
// after it was posted. Contention follows from the shared NIC: two ranks of one node that post a
// message off the node at the same time, through the same NIC, leave one after another (the second
// finds the NIC taken by the first for one message time), so the pair takes two message times
// where one rank alone takes one; with K >= 2 NICs and the two ranks on different NICs they do not
// meet. Likewise what comes into a node through one NIC comes in one message after another,
// whichever of the node's ranks it is for. A message within a node never touches a NIC, so it may
// pass while the node's NICs are busy. G = 0 (the default) is the single switch: no nodes, no
// NICs, the same timetable bit for bit. K is 1 .. G (a NIC that no rank uses is refused). The
// mutation link-per-pair keeps its one link per ordered pair (no switch, no NICs); only the extra
// latency between nodes applies to it.
//
// Leaves (--link-nodes-per-leaf M, --link-oversubscription X; needs nodes): the nodes' NICs plug
// into leaf switches of M nodes each, placed in order (leaf = node / M); the leaves meet at a spine
// that adds no delay of its own. Each leaf has one full-duplex uplink to the spine: an uplink out
// (leaf -> spine) and an uplink in (spine -> leaf), each carrying the NIC bandwidth under it
// divided by the oversubscription, M x K x `nic bandwidth` / X (X >= 1), in the same words as the
// simulator's uplink_bytes_per_s() (lab/sim/topology.h, whose one-leaf-per-NIC "rails" this model
// does not have). So:
//   same leaf:      the path between nodes above; nothing changes
//   between leaves: path = {src's link out, NIC out (src's node, local(src) % K),
//                           uplink out (src's leaf), uplink in (dst's leaf),
//                           NIC in (dst's node, local(dst) % K), dst's link in}
//                   bytes pass at min(bandwidth, nic bandwidth, uplink bandwidth),
//                   arrival = leave + latency + nic latency (the spine adds none)
// An uplink, unlike every other resource, is SHARED: it carries several messages at once, each at
// its own path's rate, as long as their rates add up to no more than its bandwidth (within
// rounding); a message whose rate does not fit beside those already on it for its whole length
// waits, as at any resource, for the earliest start at which it does (it never takes a part of its
// rate). Everything else on its path is held as above. So with X = 1 an uplink carries all its
// leaf's NICs at full rate at once: no message ever waits for one, and the timetable is the one
// without leaves, bit for bit. With X = 2, M = 2, K = 1, an uplink carries one NIC's rate: two
// messages that leave a leaf at once, from its two nodes, leave one after the other and take twice
// as long as one; the same two messages to nodes of their own leaf do not meet. Likewise what comes
// into a leaf shares its uplink in. The last leaf holds fewer than M nodes when M does not divide
// the node count; its uplink is as wide as every leaf's (the switch's cabling, as in the
// simulator), so it is less oversubscribed. M = 0 (the default), or M >= the node count (every node
// on one leaf), is one non-blocking switch between the nodes: no uplinks, the same timetable bit for
// bit. The mutation link-per-pair has no uplinks.
//
// The sender does not wait for the receiver: a buffered send returns at once (its bytes queue at
// its link out), a sendrecv waits for its own data to have left (leave) and for the message it
// receives. The receiver's recv/sendrecv returns no earlier than the arrival of the message it
// received. Messages are matched to their arrival times per (src, dst) in posting order, per tag,
// exactly as the wrapped transport matches them.
//
// Waiting: sleeps while more than ~0.3 ms remain, then yields until the deadline; every round
// checks the world's abort flag (CommError, like the wrapped transport's) and the timeout
// (a modeled transfer longer than --timeout fails the rank with a message saying so). Time while
// the run is paused does not count towards the timeout; the modeled delay itself still elapses.
// Not supported: ranks in other processes (the timetables are shared in this process's memory).
#pragma once

#include <memory>
#include <vector>

#include "transport.h"

namespace lab {

struct LinkModelOptions {
  double latency_s = 0;       // per message
  double bytes_per_s = 0;     // of every rank's link (within a node); 0: unlimited bandwidth
  // Nodes (see "Nodes" above); gpus_per_node 0: the single switch, the other three unused.
  int gpus_per_node = 0;         // ranks per node, placed in order
  double nic_bytes_per_s = 0;    // of each NIC, each direction; must be > 0 with gpus_per_node > 0
  double nic_latency_s = 0;      // added to the latency of a message that leaves its node
  int nics_per_node = 1;         // rank i of a node uses its NIC i % nics_per_node
  // Leaves (see "Leaves" above), with nodes only; nodes_per_leaf 0: every node on one non-blocking
  // switch, oversubscription unused.
  int nodes_per_leaf = 0;        // nodes per leaf switch, placed in order (the last leaf may hold fewer)
  double oversubscription = 1;   // >= 1: a leaf's uplink carries its NICs' bandwidth / oversubscription

  bool has_nodes() const { return gpus_per_node > 0; }
  int node(int rank) const { return has_nodes() ? rank / gpus_per_node : 0; }
  int local_rank(int rank) const { return has_nodes() ? rank % gpus_per_node : rank; }
  // The NIC (0 .. nics_per_node - 1) a rank's messages leave and enter its node through.
  int nic(int rank) const { return local_rank(rank) % (nics_per_node > 0 ? nics_per_node : 1); }
  bool crosses_nodes(int src, int dst) const { return has_nodes() && node(src) != node(dst); }
  bool has_leaves() const { return has_nodes() && nodes_per_leaf > 0; }
  int leaf(int rank) const { return has_leaves() ? node(rank) / nodes_per_leaf : 0; }
  bool crosses_leaves(int src, int dst) const { return has_leaves() && leaf(src) != leaf(dst); }
  // A leaf's uplink, each direction: the NIC bandwidth under it over the oversubscription (as
  // Topology::uplink_bytes_per_s(), lab/sim/topology.h, without rails).
  double uplink_bytes_per_s() const { return nodes_per_leaf * nics_per_node * nic_bytes_per_s / oversubscription; }
  // From a message's last byte leaving to its arrival.
  double latency(int src, int dst) const { return crosses_nodes(src, dst) ? latency_s + nic_latency_s : latency_s; }
  // Modeled seconds for a message of `bytes` whose path is idle, within a node (or on the switch).
  double seconds(size_t bytes) const {
    return latency_s + (bytes_per_s > 0 ? static_cast<double>(bytes) / bytes_per_s : 0.0);
  }
  // ... and from src to dst: between nodes at the slower of the link and the NIC (between leaves
  // also the uplink), plus nic_latency_s.
  double seconds(size_t bytes, int src, int dst) const;
};

// Throws ConfigError, naming the flag, where `opt` cannot describe a network of `ranks` ranks:
// negative values, gpus_per_node > 0 without nic_bytes_per_s, a world size that is not a multiple
// of gpus_per_node, nics_per_node outside 1 .. gpus_per_node, with nodes a negative nodes_per_leaf,
// and with leaves an oversubscription below 1. LinkTimetable's constructor calls it.
void check_link_model_options(const LinkModelOptions& opt, int ranks);

// The network's timetable: where each message goes on its path, by the model above. Arithmetic
// on the times it is given (it reads no clock), so the model's times can be stated exactly.
class LinkTimetable {
 public:
  // per_pair: every ordered pair of ranks has a link of its own instead (the mutation
  // link-per-pair, mutation.h: the model before the switch). Throws ConfigError where
  // check_link_model_options does.
  LinkTimetable(int ranks, const LinkModelOptions& opt, bool per_pair = false);
  ~LinkTimetable();
  struct Placed {
    double start = 0;    // its first byte enters its path
    double leave = 0;    // its last byte has left the sender
    double arrival = 0;  // leave + latency (+ nic latency between nodes)
  };
  // A message of `bytes` from src to dst, posted at time `posted`; placed after every message
  // placed before it (placements must come in order of `posted`, as the clock gives them).
  Placed place(int src, int dst, size_t bytes, double posted);
  int ranks() const { return m_n; }

 private:
  struct Resource;
  std::vector<size_t> path(int src, int dst) const;

  int m_n;
  LinkModelOptions m_opt;
  bool m_per_pair;
  std::vector<Resource> m_resources;  // links out, links in, [per-pair links,] NICs (out, in) node by
                                      // node, uplinks (out, in) leaf by leaf
  size_t m_nic_base = 0;              // index of node 0's NIC 0 out
  size_t m_uplink_base = 0;           // index of leaf 0's uplink out
  std::vector<double> m_pair_leave;  // [src * n + dst]: when the last message src -> dst placed so far leaves
};

struct LinkState;

class LinkModelWorld : public World {
 public:
  // Throws ConfigError when `inner` does not hold every rank in this process, or where
  // check_link_model_options(opt, inner's world size) does.
  LinkModelWorld(std::unique_ptr<World> inner, const LinkModelOptions& opt);
  ~LinkModelWorld() override;
  int world_size() const override;
  std::vector<int> local_ranks() const override;
  Transport& transport(int rank) override;
  const LinkModelOptions& options() const { return m_opt; }

  // The waits for a message still on the link, and how late the host woke the waiting rank after
  // its arrival time: on an idle machine tens of microseconds; on a busy one (more threads than
  // free cores) milliseconds, which every step of a collective adds to its time.
  struct WaitStats {
    uint64_t waits = 0;
    double late_total_s = 0;
    double late_max_s = 0;
    double late_mean_s() const { return waits ? late_total_s / static_cast<double>(waits) : 0.0; }
  };
  WaitStats wait_stats() const;

 private:
  std::unique_ptr<World> m_inner;
  LinkModelOptions m_opt;
  std::unique_ptr<LinkState> m_state;
  std::vector<std::unique_ptr<Transport>> m_transports;
};

// --link-latency-us L --link-gbps G: latency L microseconds, bandwidth G x 1e9 bits per second;
// --link-gpus-per-node N --link-nic-gbps NG --link-nic-latency-us NL --link-nics-per-node K: the
// nodes (N 0: none), each NIC NG x 1e9 bits per second and NL microseconds more per message
// between nodes; --link-nodes-per-leaf M --link-oversubscription X: the leaves (M 0: none).
LinkModelOptions link_model_options(double latency_us, double gbps, int gpus_per_node = 0, double nic_gbps = 0,
                                    double nic_latency_us = 0, int nics_per_node = 1, int nodes_per_leaf = 0,
                                    double oversubscription = 1);
// ... the same from a run's configuration (its --link-* flags).
struct RunConfig;
LinkModelOptions link_model_options(const RunConfig& c);

}  // namespace lab
