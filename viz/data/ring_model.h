// The traffic of one collective, rebuilt from the Chunk and Collective events every rank
// recorded: who sent which chunk to whom at which step, and what each rank's buffer holds after
// any number of steps. Nothing here assumes a ring: the view draws whatever src -> dst the events
// say, so other algorithms (naive, tree) show their own traffic.
//
// Steps: transfers are ordered by (phase, ring_step); phases that combine data (reduce-scatter,
// gather) come before phases that copy it (allgather, broadcast). "global step" k numbers them
// 0 .. steps-1 across phases: for a ring allreduce of N ranks, reduce-scatter is 0 .. N-2 and
// allgather is N-1 .. 2N-3.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "events.h"

namespace viz {

struct Transfer {
  int src = 0, dst = 0, chunk = 0;
  lab::Phase phase = lab::Phase::None;
  int ring_step = 0;     // within its phase
  int global_step = 0;   // across phases
  uint64_t bytes = 0;
  double t_start = 0, t_end = 0;
};

struct CollectiveTrace {
  uint64_t op_seq = 0;
  std::string op, what;
  int tag = -1;
  int64_t train_step = -1;
  int world = 0;
  uint64_t bytes = 0;          // S: the buffer's bytes (allreduce) as the Collective event says
  int chunks = 0;              // chunk indices 0 .. chunks-1 seen in transfers (N for a ring)
  int steps = 0;               // global steps seen so far
  std::vector<Transfer> transfers;  // by (global_step, src)
  int ranks_done = 0;          // ranks whose Collective event (the end of the call) is recorded
  bool complete() const { return world > 0 && ranks_done == world; }
  // Seconds of the call on each rank that finished it; -1 where not finished.
  std::vector<double> rank_seconds;
  std::vector<double> rank_start;   // the call's start on each finished rank
  std::vector<uint64_t> rank_bytes_sent;   // from the transfers
  std::vector<int> rank_messages;
};

// Which collectives to look at.
struct CollectiveFilter {
  std::string op = "allreduce";    // "" for any
  std::string what = "grad bucket";  // "" for any
  bool matches(const lab::Event& e) const;
};

// The highest op_seq among events matching the filter (Chunk or Collective); complete_only asks
// for one whose Collective event every rank has recorded. False when there is none.
bool latest_collective(const std::vector<std::vector<lab::Event>>& events, const CollectiveFilter& f,
                       bool complete_only, uint64_t& op_seq);
// The op_seq before `op_seq` that matches the filter (for stepping back); false when none.
bool previous_collective(const std::vector<std::vector<lab::Event>>& events, const CollectiveFilter& f,
                         uint64_t op_seq, uint64_t& out);

CollectiveTrace collect_trace(const std::vector<std::vector<lab::Event>>& events, uint64_t op_seq);

// What each rank's buffer holds: for rank r and chunk c, a bit per rank whose data is summed in.
struct BufferState {
  int world = 0, chunks = 0;
  std::vector<uint64_t> contrib;  // [r * chunks + c]
  uint64_t at(int r, int c) const { return contrib[static_cast<size_t>(r * chunks + c)]; }
  bool full(int r, int c) const;  // every rank's data is in it
};

// The buffers after the first `steps_done` global steps. Start: for an allreduce every rank holds
// its own data in every chunk; allgather: rank r holds block r only; broadcast: the root only.
// Reduce-scatter and gather add (dst |= src), allgather and broadcast copy (dst = src). Transfers
// of one step read the state before that step (they happen at the same time).
BufferState buffer_state(const CollectiveTrace& t, int steps_done);

// The chunk rank r holds complete when the combining phase ends (a ring's owner, (r + 1) mod N);
// -1 when none or more than one.
int owned_chunk(const CollectiveTrace& t, int rank);

// Bytes per link (src, dst) over the first steps_done global steps.
struct LinkBytes {
  int src = 0, dst = 0;
  uint64_t bytes = 0;
  int messages = 0;
};
std::vector<LinkBytes> link_bytes(const CollectiveTrace& t, int steps_done);

// nccl-tests' figures for an allreduce of S bytes in t seconds on N ranks:
// algbw = S / t, busbw = algbw * 2(N - 1)/N.
struct Bandwidth {
  double seconds = 0, algbw = 0, busbw = 0;  // bytes per second
  bool valid = false;
};
// t: the shortest of the finished ranks' call times (the last rank to arrive waits least; the
// others' times include waiting for it).
Bandwidth allreduce_bandwidth(const CollectiveTrace& t);

}  // namespace viz
