#include "group_transport.h"

#include <algorithm>

#include "errors.h"

namespace lab {

GroupTransport::GroupTransport(Transport& world, std::vector<int> members, const char* name)
    : m_world(world), m_members(std::move(members)), m_name(name) {
  std::vector<int> sorted = m_members;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw Error("process group '" + std::string(m_name) + "': a rank is listed twice");
  for (size_t i = 0; i < m_members.size(); ++i) {
    if (m_members[i] < 0 || m_members[i] >= world.world_size())
      throw Error("process group '" + std::string(m_name) + "': rank " + std::to_string(m_members[i]) + " is not in the world of " +
                  std::to_string(world.world_size()));
    if (m_members[i] == world.rank()) m_rank = static_cast<int>(i);
  }
  if (m_rank < 0)
    throw Error("process group '" + std::string(m_name) + "': rank " + std::to_string(world.rank()) + " is not a member");
  set_timeout(world.timeout());
}

int GroupTransport::member(int r, const char* call) const {
  if (r < 0 || r >= world_size())
    throw CommError("rank " + std::to_string(m_world.rank()) + ": " + call + " to rank " + std::to_string(r) +
                    " of process group '" + std::string(m_name) + "', which has " + std::to_string(world_size()));
  return m_members[static_cast<size_t>(r)];
}

void GroupTransport::send(int dst, const void* buf, size_t bytes, uint64_t tag) {
  m_world.send(member(dst, "send"), buf, bytes, tag);
}

void GroupTransport::recv(int src, void* buf, size_t bytes, uint64_t tag) {
  m_world.recv(member(src, "recv"), buf, bytes, tag);
}

void GroupTransport::sendrecv(int dst, const void* sbuf, size_t sbytes, int src, void* rbuf, size_t rbytes,
                              uint64_t tag) {
  m_world.sendrecv(member(dst, "sendrecv"), sbuf, sbytes, member(src, "sendrecv"), rbuf, rbytes, tag);
}

void GroupTransport::sendrecv_reduce(int dst, const float* sbuf, size_t scount, int src, float* acc, size_t rcount,
                                     uint64_t tag) {
  m_world.sendrecv_reduce(member(dst, "sendrecv_reduce"), sbuf, scount, member(src, "sendrecv_reduce"), acc, rcount,
                          tag);
}

std::vector<int> GridShape::data_group(int rank) const {
  GridCoords c = coords(rank);
  std::vector<int> out;
  for (c.d = 0; c.d < dp; ++c.d) out.push_back(rank_of(c));
  return out;
}

std::vector<int> GridShape::pipeline_group(int rank) const {
  GridCoords c = coords(rank);
  std::vector<int> out;
  for (c.p = 0; c.p < pp; ++c.p) out.push_back(rank_of(c));
  return out;
}

std::vector<int> GridShape::tensor_group(int rank) const {
  GridCoords c = coords(rank);
  std::vector<int> out;
  for (c.t = 0; c.t < tp; ++c.t) out.push_back(rank_of(c));
  return out;
}

}  // namespace lab
