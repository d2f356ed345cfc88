// GroupTransport: a process group (torch.distributed.new_group) as a Transport. Some ranks of a
// world form a group; inside it they are numbered 0..n-1 in the order of `members` (world ranks),
// and every message goes through the world's transport between the members' world ranks. The
// collectives (ring_allreduce.h, ...) run on it unchanged, and a Communicator over it records its
// events with the members' world ranks and the group's name (Transport::world_rank, group_name),
// so the trace and the views see which ranks talked, and in which group.
//
// Grids of parallelism (data x pipeline x tensor) give every rank one group per axis; two ranks
// share at most one group (they differ in one coordinate), so the messages of different groups
// never travel between the same two ranks, and each group may number its messages (tags) as it
// likes. Abort, timeout and hold are the world's: a failure in one group stops every rank.
#pragma once

#include <string>
#include <vector>

#include "transport.h"

namespace lab {

class GroupTransport final : public Transport {
 public:
  // members: the group's world ranks, in group order; the world transport's rank must be one of them.
  // Throws Error otherwise, or for a repeated or out-of-range member. name: a static string ("dp"):
  // the events recorded over the group point to it, and outlive the group (trace.json is written
  // after the ranks are gone).
  GroupTransport(Transport& world, std::vector<int> members, const char* name);
  int rank() const override { return m_rank; }
  int world_size() const override { return static_cast<int>(m_members.size()); }
  const char* name() const override { return m_world.name(); }
  int world_rank(int r) const override { return m_members[static_cast<size_t>(r)]; }
  const char* group_name() const override { return m_name; }
  const std::vector<int>& members() const { return m_members; }

  void send(int dst, const void* buf, size_t bytes, uint64_t tag) override;
  void recv(int src, void* buf, size_t bytes, uint64_t tag) override;
  void sendrecv(int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes, uint64_t tag) override;
  void sendrecv_reduce(int dst, const float* sbuf, size_t scount, int src, float* acc, size_t rcount,
                       uint64_t tag) override;
  void abort(const std::string& reason) override { m_world.abort(reason); }
  bool aborted() const override { return m_world.aborted(); }
  std::string abort_reason() const override { return m_world.abort_reason(); }

 private:
  int member(int r, const char* call) const;  // the world rank of group rank r (CommError when out of range)
  Transport& m_world;
  std::vector<int> m_members;
  const char* m_name;  // static
  int m_rank = -1;
};

// The groups of a grid of D x P x T ranks, Megatron-LM's placement (tensor fastest, then data,
// then pipeline): world rank = t + T (d + D p). For `rank`, the members of its data-parallel group
// (same p and t), its pipeline group (same d and t) and its tensor group (same d and p), each in
// increasing coordinate order.
struct GridCoords {
  int d = 0, p = 0, t = 0;
};
struct GridShape {
  int dp = 1, pp = 1, tp = 1;
  int size() const { return dp * pp * tp; }
  GridCoords coords(int rank) const { return {(rank / tp) % dp, rank / (tp * dp), rank % tp}; }
  int rank_of(GridCoords c) const { return c.t + tp * (c.d + dp * c.p); }
  std::vector<int> data_group(int rank) const;
  std::vector<int> pipeline_group(int rank) const;
  std::vector<int> tensor_group(int rank) const;
};

}  // namespace lab
