#include "transport.h"

#include <cstdio>

#include "errors.h"

namespace lab {

void Transport::sendrecv_reduce(int dst, const float* sbuf, size_t scount, int src, float* acc, size_t rcount,
                                uint64_t tag) {
  if (m_scratch.size() < rcount) m_scratch.resize(rcount);
  sendrecv(dst, sbuf, scount * sizeof(float), src, m_scratch.data(), rcount * sizeof(float), tag);
  for (size_t i = 0; i < rcount; ++i) acc[i] += m_scratch[i];
}

void Transport::sendrecv_on(DeviceMemory&, int, const void*, size_t, int, void*, size_t, uint64_t) {
  throw Error(std::string("the ") + name() + " transport cannot move device memory (Transport::device_aware)");
}

void Transport::sendrecv_reduce_on(DeviceMemory&, int, const float*, size_t, int, float*, size_t, uint64_t) {
  throw Error(std::string("the ") + name() + " transport cannot move device memory (Transport::device_aware)");
}

void Transport::native_allreduce_sum_on(DeviceMemory&, float*, size_t) {
  throw Error(std::string("the ") + name() + " transport's own allreduce cannot work on device memory");
}

std::string seconds_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", seconds);
  return buf;
}

void Transport::native_allreduce_sum(float*, size_t) {
  throw ConfigError(std::string("the ") + name() + " transport has no allreduce of its own",
                    "--allreduce mpi needs --comm mpi, --allreduce nccl needs --comm nccl");
}

int Transport::recv_any(const std::vector<int>&, void*, size_t, uint64_t) {
  throw ConfigError(std::string("the ") + name() + " transport cannot receive from whichever rank sends first",
                    "--mode async runs with --comm threads");
}

}  // namespace lab
