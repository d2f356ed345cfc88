// LinkModelWorld: a simulated network between emulated ranks (--link-latency-us, --link-gbps).
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
// it was posted (or after the previous message between the same two ranks).
//
// Resources. A message's path is a list of resources (each with its own bandwidth
// and its own timetable); here the path is {src's link out, dst's link in}. A resource that
// several ranks share (a NIC, a switch uplink between nodes) is one more entry on the paths that
// cross it, with its own bandwidth: the message then occupies its path at the slowest resource's
// rate. LinkTimetable::path() is the one place that says which resources a message crosses.
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
  double bytes_per_s = 0;     // of every link; 0: unlimited bandwidth
  // Modeled seconds for a message of `bytes` whose path is idle.
  double seconds(size_t bytes) const {
    return latency_s + (bytes_per_s > 0 ? static_cast<double>(bytes) / bytes_per_s : 0.0);
  }
};

// The network's timetable: where each message goes on its path, by the model above. Arithmetic
// on the times it is given (it reads no clock), so the model's times can be stated exactly.
class LinkTimetable {
 public:
  // per_pair: every ordered pair of ranks has a link of its own instead (the mutation
  // link-per-pair, mutation.h: the model before the switch).
  LinkTimetable(int ranks, const LinkModelOptions& opt, bool per_pair = false);
  ~LinkTimetable();
  struct Placed {
    double start = 0;    // its first byte enters its path
    double leave = 0;    // its last byte has left the sender
    double arrival = 0;  // leave + latency
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
  std::vector<Resource> m_resources;
  std::vector<double> m_pair_leave;  // [src * n + dst]: when the last message src -> dst placed so far leaves
};

struct LinkState;

class LinkModelWorld : public World {
 public:
  // Throws ConfigError when `inner` does not hold every rank in this process.
  LinkModelWorld(std::unique_ptr<World> inner, const LinkModelOptions& opt);
  ~LinkModelWorld() override;
  int world_size() const override;
  std::vector<int> local_ranks() const override;
  Transport& transport(int rank) override;
  const LinkModelOptions& options() const { return m_opt; }

 private:
  std::unique_ptr<World> m_inner;
  LinkModelOptions m_opt;
  std::unique_ptr<LinkState> m_state;
  std::vector<std::unique_ptr<Transport>> m_transports;
};

// --link-latency-us L --link-gbps G: latency L microseconds, bandwidth G x 1e9 bits per second.
LinkModelOptions link_model_options(double latency_us, double gbps);

}  // namespace lab
