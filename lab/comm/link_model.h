// LinkModelWorld: a simulated network between emulated ranks (--link-latency-us, --link-gbps).
// It decorates any World whose ranks all live in this process: every rank's Transport is wrapped
// so that each message completes no earlier than the model says, and the collectives above it
// (ring allreduce, broadcast chains, DataParallel's scatter/gather) take the time they would on
// such a network, while the data still moves through the wrapped transport.
//
// The model. Every ordered pair of ranks (src -> dst) has its own full-duplex link: a message of
// b bytes posted at time t starts once the link has finished the messages posted before it on the
// same link, occupies it for b / bandwidth, and arrives `latency` later:
//   start   = max(t, link_free)        link_free = start + b / bandwidth
//   arrival = link_free + latency
// The sender does not wait (a buffered send returns at once, a sendrecv waits only for its own
// data to have left, i.e. link_free). The receiver's recv/sendrecv returns no earlier than the
// arrival of the message it received. Messages are matched to their arrival times per link in
// posting order, per tag, exactly as the wrapped transport matches them.
//
// Waiting: sleeps while more than ~0.3 ms remain, then yields until the deadline; every round
// checks the world's abort flag (CommError, like the wrapped transport's) and the timeout
// (a modeled transfer longer than --timeout fails the rank with a message saying so). Time while
// the run is paused does not count towards the timeout; the modeled delay itself still elapses.
// Not supported: ranks in other processes (the arrival times are shared in this process's memory).
#pragma once

#include <memory>

#include "transport.h"

namespace lab {

struct LinkModelOptions {
  double latency_s = 0;       // per message
  double bytes_per_s = 0;     // 0: unlimited bandwidth
  // Modeled seconds on an idle link for a message of `bytes`.
  double seconds(size_t bytes) const {
    return latency_s + (bytes_per_s > 0 ? static_cast<double>(bytes) / bytes_per_s : 0.0);
  }
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
