#include "ring_model.h"

#include "mode.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "ring_allreduce.h"  // RingChunks, kRingSegmentBytes
#include "tree_allreduce.h"  // kTreeDoublingBytes

namespace viz {

namespace {

// Order of phases within one collective, as they happen: a tree's fold-in (gather) comes before
// its reduce-scatter, its fold-out (broadcast) after its allgather; naive gathers, then
// broadcasts.
int phase_rank(lab::Phase p) {
  switch (p) {
    case lab::Phase::Gather: return 0;
    case lab::Phase::Reduce: return 0;
    case lab::Phase::ReduceScatter: return 1;
    case lab::Phase::Allgather: return 2;
    case lab::Phase::Scatter: return 3;
    case lab::Phase::Broadcast: return 3;
    default: return 4;
  }
}

bool combines(lab::Phase p) {
  return p == lab::Phase::ReduceScatter || p == lab::Phase::Gather || p == lab::Phase::Reduce;
}

uint64_t bit(int r) { return uint64_t{1} << (r & 63); }

bool known_algorithm(const std::string& a) { return a == "ring" || a == "naive" || a == "tree"; }

// p, the largest power of two <= n, and log2(p)
int power_of_two_below(int n, int* levels = nullptr) {
  int p = 1, l = 0;
  while (p * 2 <= n) {
    p *= 2;
    ++l;
  }
  if (levels) *levels = l;
  return p;
}

}  // namespace

bool CollectiveFilter::matches(const lab::Event& e) const {
  if (e.kind == lab::EventKind::Compute || e.kind == lab::EventKind::Device) return false;
  if (!op.empty() && op != e.op) return false;
  if (!what.empty() && std::find(what.begin(), what.end(), e.what) == what.end()) return false;
  return true;
}

CollectiveFilter training_sync_filter(const lab::RunConfig& c) {
  const lab::ParallelMode* m = lab::find_mode(c.mode);
  const lab::SyncCollectives s = m ? m->sync_collectives() : lab::SyncCollectives{};
  CollectiveFilter f;
  f.op = s.op;
  f.what = s.what;
  return f;
}

int allreduce_blocks(const std::string& algorithm, int world) {
  if (algorithm == "naive") return 1;
  if (algorithm == "tree") return power_of_two_below(std::max(1, world));
  return std::max(1, world);
}

std::vector<PhaseSteps> allreduce_phases(const std::string& algorithm, int n, uint64_t bytes) {
  if (n <= 1) return {};
  if (algorithm == "naive") return {{lab::Phase::Gather, n - 1, 1}, {lab::Phase::Broadcast, n - 1, 1}};
  if (algorithm == "tree") {
    int levels = 0;
    const int p = power_of_two_below(n, &levels);
    std::vector<PhaseSteps> out;
    if (n > p) out.push_back({lab::Phase::Gather, 1, n - p});
    out.push_back({lab::Phase::ReduceScatter, levels, p});
    if (bytes > lab::kTreeDoublingBytes) out.push_back({lab::Phase::Allgather, levels, p});
    if (n > p) out.push_back({lab::Phase::Broadcast, 1, n - p});
    return out;
  }
  return {{lab::Phase::ReduceScatter, n - 1, n}, {lab::Phase::Allgather, n - 1, n}};
}

RankSends allreduce_rank_sends(const std::string& algorithm, int n, uint64_t bytes, int r) {
  RankSends out;
  if (n <= 1 || r < 0 || r >= n) return out;
  const size_t count = bytes / sizeof(float);
  if (algorithm == "naive") {
    out.bytes = r == 0 ? static_cast<uint64_t>(n - 1) * bytes : bytes;
    out.messages = r == 0 ? n - 1 : 1;
    return out;
  }
  if (algorithm == "tree") {
    int levels = 0;
    const int p = power_of_two_below(n, &levels);
    if (r >= p) return {bytes, 1};  // an extra rank: its fold-in, nothing else
    const int fold_out = r < n - p ? 1 : 0;
    if (bytes <= lab::kTreeDoublingBytes) return {static_cast<uint64_t>(levels + fold_out) * bytes, levels + fold_out};
    const lab::RingChunks blocks{count, p};
    auto range = [&](int first, int len) { return (blocks.begin(first + len) - blocks.begin(first)) * sizeof(float); };
    uint64_t b = bytes - blocks.size(r) * sizeof(float);  // reduce-scatter: every block but its own, once
    for (int k = 0; k < levels; ++k) b += range(r & ~((1 << k) - 1), 1 << k);  // allgather: its growing range
    return {b + static_cast<uint64_t>(fold_out) * bytes, 2 * levels + fold_out};
  }
  // the pipelined ring: 2(N-1) steps, each chunk in G segments
  const lab::RingChunks chunks{count, n};
  const size_t largest = chunks.size(0) * sizeof(float);
  const int segments = std::max<int>(1, static_cast<int>((largest + lab::kRingSegmentBytes - 1) / lab::kRingSegmentBytes));
  uint64_t b = 0;
  for (int s = 0; s < n - 1; ++s) {
    b += chunks.size(((r - s) % n + n) % n) * sizeof(float);
    b += chunks.size(((r + 1 - s) % n + n) % n) * sizeof(float);
  }
  return {b, 2 * (n - 1) * segments};
}

bool latest_collective(const std::vector<std::vector<lab::Event>>& events, const CollectiveFilter& f,
                       bool complete_only, uint64_t& op_seq) {
  const int world = static_cast<int>(events.size());
  bool found = false;
  uint64_t best = 0;
  if (!complete_only) {
    for (const auto& log : events)
      for (auto it = log.rbegin(); it != log.rend(); ++it)
        if (f.matches(*it)) {
          if (!found || it->op_seq > best) best = it->op_seq;
          found = true;
          break;  // logs are in recording order: the last match is the newest on this rank
        }
    op_seq = best;
    return found;
  }
  // Complete: the newest op_seq whose Collective event is on every rank. Op numbers are the same
  // on all ranks, so the smallest "newest finished" over ranks is finished everywhere.
  for (const auto& log : events) {
    bool rank_found = false;
    uint64_t rank_best = 0;
    for (auto it = log.rbegin(); it != log.rend(); ++it)
      if (it->kind == lab::EventKind::Collective && f.matches(*it)) {
        rank_best = it->op_seq;
        rank_found = true;
        break;
      }
    if (!rank_found) return false;
    best = found ? std::min(best, rank_best) : rank_best;
    found = true;
  }
  op_seq = best;
  return found && world > 0;
}

bool collective_of_iteration(const std::vector<std::vector<lab::Event>>& events, const CollectiveFilter& f,
                             int64_t iteration, uint64_t& op_seq) {
  if (events.empty()) return false;
  for (const lab::Event& e : events[0])
    if (e.kind == lab::EventKind::Collective && e.train_step == iteration && f.matches(e)) {
      op_seq = e.op_seq;
      return true;
    }
  return false;
}

bool previous_collective(const std::vector<std::vector<lab::Event>>& events, const CollectiveFilter& f,
                         uint64_t op_seq, uint64_t& out) {
  bool found = false;
  if (events.empty()) return false;
  for (auto it = events[0].rbegin(); it != events[0].rend(); ++it)
    if (it->kind == lab::EventKind::Collective && f.matches(*it) && it->op_seq < op_seq) {
      out = it->op_seq;
      found = true;
      break;
    }
  return found;
}

int allreduce_global_step(const std::string& algorithm, int world, const lab::Event& e) {
  // Only a tree's fold-out needs the buffer's size (whether it took the allgather-free doubling
  // path), and it carries the whole buffer.
  const uint64_t bytes = e.phase == lab::Phase::Broadcast ? e.bytes : ~uint64_t{0};
  int offset = 0;
  for (const PhaseSteps& p : allreduce_phases(algorithm, world, bytes)) {
    if (p.phase == e.phase) return offset + e.ring_step;
    offset += p.steps;
  }
  return e.ring_step;
}

std::vector<PhaseSteps> collective_phases(const std::string& op, const std::string& algorithm, int n, uint64_t bytes) {
  if (op == "allreduce") return allreduce_phases(algorithm, n, bytes);
  if (n <= 1 || (op != "reduce_scatter" && op != "allgather")) return {};
  const bool rs = op == "reduce_scatter";
  if (algorithm == "naive")  // through rank 0: gather, then scatter the blocks or broadcast the whole
    return {{lab::Phase::Gather, n - 1, 1}, {rs ? lab::Phase::Scatter : lab::Phase::Broadcast, n - 1, 1}};
  const lab::Phase phase = rs ? lab::Phase::ReduceScatter : lab::Phase::Allgather;
  if (algorithm == "tree") {  // recursive halving or doubling (a power-of-two world)
    int levels = 0;
    power_of_two_below(n, &levels);
    return {{phase, levels, n}};
  }
  return {{phase, n - 1, n}};
}

int collective_global_step(const std::string& op, const std::string& algorithm, int n, const lab::Event& e) {
  if (op == "allreduce") return allreduce_global_step(algorithm, n, e);
  int offset = 0;
  for (const PhaseSteps& p : collective_phases(op, algorithm, n, e.bytes)) {
    if (p.phase == e.phase) return offset + e.ring_step;
    offset += p.steps;
  }
  return std::max(0, e.ring_step);
}

CollectiveTrace collect_trace(const std::vector<std::vector<lab::Event>>& events, uint64_t op_seq,
                              const std::string& algorithm) {
  CollectiveTrace t;
  t.op_seq = op_seq;
  t.world = static_cast<int>(events.size());
  t.rank_seconds.assign(events.size(), -1.0);
  t.rank_start.assign(events.size(), 0.0);
  t.rank_bytes_sent.assign(events.size(), 0);
  t.rank_messages.assign(events.size(), 0);
  for (size_t r = 0; r < events.size(); ++r) {
    const auto& log = events[r];
    // Events of one collective sit together near the end: search backwards until an older op.
    for (auto it = log.rbegin(); it != log.rend(); ++it) {
      const lab::Event& e = *it;
      if (e.kind == lab::EventKind::Compute || e.kind == lab::EventKind::Device) continue;
      if (e.op_seq < op_seq && e.kind == lab::EventKind::Collective) break;
      if (e.op_seq != op_seq) continue;
      if (t.op.empty()) {
        t.op = e.op;
        t.what = e.what;
        t.tag = e.tag;
        t.train_step = e.train_step;
      }
      if (e.kind == lab::EventKind::Collective) {
        t.bytes = e.bytes;
        ++t.ranks_done;
        t.rank_seconds[r] = e.t_end - e.t_start;
        t.rank_start[r] = e.t_start;
      } else {
        Transfer x;
        x.src = e.src;
        x.dst = e.dst;
        x.chunk = e.chunk;
        x.phase = e.phase;
        x.ring_step = std::max(0, e.ring_step);  // -1: a phase of one step (DataParallel's transfers)
        x.bytes = e.bytes;
        x.t_start = e.t_start;
        x.t_end = e.t_end;
        t.transfers.push_back(x);
        t.rank_bytes_sent[r] += e.bytes;
        t.rank_messages[r] += 1;
      }
    }
  }
  // Global steps: phases in order, each phase's ring steps after the previous phase's last one.
  std::map<int, int> phase_len;  // phase_rank -> max ring_step + 1
  for (const Transfer& x : t.transfers) {
    int& len = phase_len[phase_rank(x.phase)];
    len = std::max(len, x.ring_step + 1);
    t.chunks = std::max(t.chunks, x.chunk + 1);
  }
  std::map<int, int> offset;
  int total = 0;
  for (const auto& kv : phase_len) {
    offset[kv.first] = total;
    total += kv.second;
  }
  for (Transfer& x : t.transfers) x.global_step = offset[phase_rank(x.phase)] + x.ring_step;
  t.steps = total;
  if (t.bytes == 0 && t.op == "allreduce") {
    // Still running (no Collective event yet): S from the first step, in which every part of the
    // buffer is sent by some rank (a ring's N chunks, a tree's two halves or its fold-in, naive's
    // first whole buffer): per chunk, the most one rank sent of it (segments add up).
    std::map<std::pair<int, int>, uint64_t> sent;  // (chunk, src) -> bytes in step 0
    for (const Transfer& x : t.transfers)
      if (x.global_step == 0) sent[{x.chunk, x.src}] += x.bytes;
    std::map<int, uint64_t> chunk_bytes;
    for (const auto& kv : sent) chunk_bytes[kv.first.first] = std::max(chunk_bytes[kv.first.first], kv.second);
    for (const auto& kv : chunk_bytes) t.bytes += kv.second;
  }
  if (t.op == "allreduce" && t.world > 1 && known_algorithm(algorithm)) {
    // The algorithm's blocks; a transfer carries those its bytes cover, from its chunk on.
    t.algorithm = algorithm;
    t.chunks = allreduce_blocks(algorithm, t.world);
    const lab::RingChunks blocks{t.bytes / sizeof(float), t.chunks};
    for (Transfer& x : t.transfers) {
      uint64_t covered = 0;
      int k = 0;
      while (x.chunk + k < t.chunks && covered < x.bytes) covered += blocks.size(x.chunk + k++) * sizeof(float);
      x.blocks = std::max(1, k);
    }
  } else if ((t.op == "reduce_scatter" || t.op == "allgather") && known_algorithm(algorithm)) {
    t.algorithm = algorithm;  // its phases (collective_phases), where its transfers say it ran them
  } else if (t.op == "reduce") {
    // DataParallel's gradient reduce: every device's whole gradient buffer into device 0.
    t.chunks = 1;
    for (Transfer& x : t.transfers) x.chunk = 0;
  } else if (t.op == "allreduce" && t.world > 1) {
    t.chunks = std::max(t.chunks, t.world);
  }
  std::sort(t.transfers.begin(), t.transfers.end(), [](const Transfer& a, const Transfer& b) {
    return a.global_step != b.global_step ? a.global_step < b.global_step : a.src < b.src;
  });
  return t;
}

bool BufferState::full(int r, int c) const {
  const uint64_t all = world >= 64 ? ~uint64_t{0} : (uint64_t{1} << world) - 1;
  return (at(r, c) & all) == all;
}

BufferState buffer_state(const CollectiveTrace& t, int steps_done) {
  BufferState s;
  s.world = t.world;
  s.chunks = std::max(1, t.chunks);
  s.contrib.assign(static_cast<size_t>(s.world * s.chunks), 0);
  int root = -1;
  for (const Transfer& x : t.transfers)
    if ((x.phase == lab::Phase::Broadcast || x.phase == lab::Phase::Scatter) && x.ring_step == 0) root = x.src;
  const bool from_root = t.op == "broadcast" || t.op == "scatter" || t.op == "replicate";
  const bool own_block = t.op == "allgather" || t.op == "gather";
  for (int r = 0; r < s.world; ++r)
    for (int c = 0; c < s.chunks; ++c) {
      uint64_t v = 0;
      if (own_block) v = c == r ? bit(r) : 0;
      else if (from_root) v = r == root ? bit(r) : 0;
      else v = bit(r);
      s.contrib[static_cast<size_t>(r * s.chunks + c)] = v;
    }
  size_t i = 0;
  for (int step = 0; step < steps_done; ++step) {
    const std::vector<uint64_t> before = s.contrib;
    for (; i < t.transfers.size() && t.transfers[i].global_step == step; ++i) {
      const Transfer& x = t.transfers[i];
      if (x.src < 0 || x.dst < 0 || x.src >= s.world || x.dst >= s.world || x.chunk < 0) continue;
      for (int c = x.chunk; c < x.chunk + x.blocks && c < s.chunks; ++c) {
        const uint64_t v = before[static_cast<size_t>(x.src * s.chunks + c)];
        uint64_t& d = s.contrib[static_cast<size_t>(x.dst * s.chunks + c)];
        d = combines(x.phase) ? (d | v) : v;
      }
    }
    while (i < t.transfers.size() && t.transfers[i].global_step <= step) ++i;
  }
  return s;
}

int owned_chunk(const CollectiveTrace& t, int rank) {
  int combine_steps = 0;
  for (const Transfer& x : t.transfers)
    if (combines(x.phase)) combine_steps = std::max(combine_steps, x.global_step + 1);
  if (combine_steps == 0 || rank < 0 || rank >= t.world) return -1;
  const BufferState s = buffer_state(t, combine_steps);
  int owned = -1;
  for (int c = 0; c < s.chunks; ++c)
    if (s.full(rank, c)) {
      if (owned >= 0) return -1;
      owned = c;
    }
  return owned;
}

std::vector<LinkBytes> link_bytes(const CollectiveTrace& t, int steps_done) {
  std::map<std::pair<int, int>, LinkBytes> m;
  for (const Transfer& x : t.transfers) {
    if (x.global_step >= steps_done) continue;
    LinkBytes& l = m[{x.src, x.dst}];
    l.src = x.src;
    l.dst = x.dst;
    l.bytes += x.bytes;
    l.messages += 1;
  }
  std::vector<LinkBytes> out;
  for (const auto& kv : m) out.push_back(kv.second);
  return out;
}

Bandwidth allreduce_bandwidth(const CollectiveTrace& t) {
  Bandwidth b;
  double best = -1;
  for (double s : t.rank_seconds)
    if (s > 0 && (best < 0 || s < best)) best = s;
  if (best <= 0 || t.world < 1) return b;
  b.seconds = best;
  b.algbw = static_cast<double>(t.bytes) / best;
  b.busbw = b.algbw * 2.0 * (t.world - 1) / t.world;
  b.valid = true;
  return b;
}

}  // namespace viz
