// Communication figures of a finished run, computed from the ranks' events (training steps only:
// the initial broadcast and the evaluations are left out).
//   traffic   bytes moved (every Chunk event is one message, recorded by its sender), what each
//             rank sent and received, and rank 0's share: (sent + received by rank 0) / bytes
//             moved. With DataParallel every message starts or ends at device 0 (share 1); with
//             a ring allreduce a rank carries 2/N of the bytes.
//   overlap   per rank: seconds inside collectives (Collective events), and the part of them
//             that ran while the same rank was computing its backward pass (Compute events of
//             phase Backward): communication hidden behind computation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "events.h"

namespace lab {

struct TrafficStats {
  uint64_t bytes_moved = 0;
  std::vector<uint64_t> sent, received;  // per rank
  double rank0_share = 0;                // (sent[0] + received[0]) / bytes_moved; 0 when nothing moved
  // The same split by what the messages carried (Event::what: "grad bucket", "buffers",
  // "bn stats", ...), so a lesson can take the gradients' traffic alone.
  struct Part {
    std::string what;
    uint64_t bytes_moved = 0;
    std::vector<uint64_t> sent, received;  // per rank
  };
  std::vector<Part> by_what;             // in order of first appearance
};

struct OverlapStats {
  std::vector<double> comm_seconds;    // per rank
  std::vector<double> hidden_seconds;  // per rank: overlapping the rank's backward
  double comm_seconds_total = 0, hidden_seconds_total = 0;
  double hidden_fraction = 0;          // hidden_seconds_total / comm_seconds_total (0 without comm)
};

// Seconds of computation per rank and phase during the training steps (Compute events).
struct ComputeStats {
  std::vector<double> forward, backward, optimizer;  // per rank
};

// DDP's gradient buckets as the last training step reduced them on rank 0: index and bytes
// (bucket 0 holds the last layers' gradients, ready first in backward).
struct BucketInfo {
  int index = 0;
  uint64_t bytes = 0;
};

// events_per_rank[r]: rank r's events.
ComputeStats compute_stats(const std::vector<std::vector<Event>>& events_per_rank);
std::vector<BucketInfo> grad_buckets(const std::vector<std::vector<Event>>& events_per_rank);
TrafficStats traffic_stats(const std::vector<std::vector<Event>>& events_per_rank);
OverlapStats overlap_stats(const std::vector<std::vector<Event>>& events_per_rank);

}  // namespace lab
