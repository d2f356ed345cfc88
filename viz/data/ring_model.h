// The traffic of one collective, rebuilt from the Chunk and Collective events every rank
// recorded: who sent which chunk to whom at which step, and what each rank's buffer holds after
// any number of steps. Nothing here assumes a ring: the view draws whatever src -> dst the events
// say, so other algorithms (naive, tree) and DataParallel's transfers show their own traffic.
//
// Steps: transfers are ordered by (phase, ring_step), phases in the order they happen: gather
// (naive's sends to rank 0, tree's fold-in of the ranks past a power of two), reduce-scatter,
// allgather, broadcast (naive's sums from rank 0, tree's fold-out). "global step" k numbers them
// 0 .. steps-1 across phases: for a ring allreduce of N ranks, reduce-scatter is 0 .. N-2 and
// allgather is N-1 .. 2N-3.
//
// Blocks: an allreduce cuts its buffer into blocks as its algorithm does (ring: N chunks; tree: p
// blocks, p the largest power of two <= N; naive: the whole buffer). A transfer carries the blocks
// from its `chunk` on, as many as its bytes cover (a tree step sends a range of blocks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "events.h"

namespace viz {

struct Transfer {
  int src = 0, dst = 0, chunk = 0;
  int blocks = 1;        // consecutive blocks from `chunk` that it carries
  lab::Phase phase = lab::Phase::None;
  int ring_step = 0;     // within its phase
  int global_step = 0;   // across phases
  uint64_t bytes = 0;
  double t_start = 0, t_end = 0;
};

struct CollectiveTrace {
  uint64_t op_seq = 0;
  std::string op, what;
  std::string algorithm;       // allreduce: "ring", "naive", "tree" (as collect_trace was told)
  int tag = -1;
  int64_t train_step = -1;
  int world = 0;
  uint64_t bytes = 0;          // S: the buffer's bytes (allreduce) as the Collective event says
  int chunks = 0;              // blocks of the buffer (an allreduce: as its algorithm cuts it;
                               //   else the chunk indices seen in transfers)
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
  std::string op = "allreduce";                 // "" for any
  std::vector<std::string> what{"grad bucket"};  // empty for any
  bool matches(const lab::Event& e) const;
};

// The collectives that synchronize training in a parallelism mode (lab::RunConfig::mode): DDP's
// gradient bucket allreduces; local SGD's, and its parameter averages; DataParallel's reduce of
// every device's gradients into device 0.
CollectiveFilter training_sync_filter(const lab::RunConfig& c);

// The phases of one allreduce in the order they happen, with their steps, for an algorithm on N
// ranks and S bytes (lab/comm/ring_allreduce.h, naive_allreduce.h, tree_allreduce.h).
struct PhaseSteps {
  lab::Phase phase = lab::Phase::None;
  int steps = 0;
  int senders = 0;  // ranks that send in each of its steps
};
std::vector<PhaseSteps> allreduce_phases(const std::string& algorithm, int world, uint64_t bytes);
// Blocks the algorithm cuts the buffer into: ring N, tree the largest power of two <= N, naive 1.
int allreduce_blocks(const std::string& algorithm, int world);
// What rank r sends in one allreduce of S bytes: bytes and messages.
struct RankSends {
  uint64_t bytes = 0;
  int messages = 0;
};
RankSends allreduce_rank_sends(const std::string& algorithm, int world, uint64_t bytes, int rank);
// The global step of one transfer event of an allreduce (its phase and ring_step) as
// collect_trace numbers it, from the event alone: for gates that stop partway through.
int allreduce_global_step(const std::string& algorithm, int world, const lab::Event& e);
// The same for any collective the views stage (op: "allreduce", "reduce_scatter", "allgather";
// lab/comm/sharded_collectives.h gives the last two their own phases; any other op: its transfers'
// ring steps as they are).
std::vector<PhaseSteps> collective_phases(const std::string& op, const std::string& algorithm, int world, uint64_t bytes);
int collective_global_step(const std::string& op, const std::string& algorithm, int world, const lab::Event& e);

// The highest op_seq among events matching the filter (Chunk or Collective); complete_only asks
// for one whose Collective event every rank has recorded. False when there is none.
bool latest_collective(const std::vector<std::vector<lab::Event>>& events, const CollectiveFilter& f,
                       bool complete_only, uint64_t& op_seq);
// The first collective of training iteration `iteration` that matches the filter (rank 0's log,
// Collective events; every rank numbers collectives alike): a lesson's observed iteration. False
// when the trace holds none.
bool collective_of_iteration(const std::vector<std::vector<lab::Event>>& events, const CollectiveFilter& f,
                             int64_t iteration, uint64_t& op_seq);
// The op_seq before `op_seq` that matches the filter (for stepping back); false when none.
bool previous_collective(const std::vector<std::vector<lab::Event>>& events, const CollectiveFilter& f,
                         uint64_t op_seq, uint64_t& out);

// algorithm: the run's allreduce algorithm (for allreduces' blocks; other collectives ignore it).
CollectiveTrace collect_trace(const std::vector<std::vector<lab::Event>>& events, uint64_t op_seq,
                              const std::string& algorithm = "ring");

// What each rank's buffer holds: for rank r and chunk c, a bit per rank whose data is summed in.
struct BufferState {
  int world = 0, chunks = 0;
  std::vector<uint64_t> contrib;  // [r * chunks + c]
  uint64_t at(int r, int c) const { return contrib[static_cast<size_t>(r * chunks + c)]; }
  bool full(int r, int c) const;  // every rank's data is in it
};

// The buffers after the first `steps_done` global steps. Start: for an allreduce (and
// DataParallel's reduce) every rank holds its own data in every block; allgather and gather: rank
// r holds block r only; broadcast, scatter and replicate: the root only. Reduce-scatter, gather and
// reduce add (dst |= src), allgather and broadcast copy (dst = src). Transfers of one step read
// the state before that step (they happen at the same time).
BufferState buffer_state(const CollectiveTrace& t, int steps_done);

// The block rank r holds complete when the combining phases end (a ring's owner, (r + 1) mod N; a
// tree's block r; naive's rank 0 the whole buffer); -1 when none or more than one.
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
