// DeviceMemory: the memory of a device (a GPU, or the simulated one) as the collectives see it,
// so that an allreduce can work on buffers that live there (Communicator::allreduce_sum's `mem`)
// instead of host memory. A device-aware transport (Transport::device_aware: the threads
// transport, whose emulated ranks share one device) moves and adds the chunks with these calls in
// place of memcpy and the CPU's add: device-to-device copies between the ranks' buffers, the
// reduction a kernel. A transport that is not (MPI: our Open MPI is not CUDA-aware) gets the
// buffer staged through host memory by the Communicator: one download and one upload per
// collective, which the device's timeline shows.
//
// Every call is ordered after the calling rank's earlier work on the device and complete when it
// returns (a GPU's implementation waits for its stream; the simulated GPU's is the CPU's), so a
// peer rank may read what it wrote as soon as the transport says so. Every rank of a collective
// passes buffers of the same device.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace lab {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // "sim", "cuda:0": where the buffers live, for messages and the trace.
  virtual std::string name() const = 0;
  // dst <- src, `bytes` bytes, both on this device (the buffers of any rank sharing it).
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // acc[i] += in[i] for i < count, float32, each element once (the CPU's add and the ring's order
  // of additions: the same bits as the host's reduction).
  virtual void add(float* acc, const float* in, size_t count) = 0;
  // host <- device and device <- host.
  virtual void download(void* host, const void* device, size_t bytes) = 0;
  virtual void upload(void* device, const void* host, size_t bytes) = 0;
  // x[i] *= k for i < count, float32 (DDP's 1/world_size as a gradient enters its bucket).
  virtual void scale(float* x, float k, size_t count) = 0;
  // x[i] /= d for i < count, float32 (a communication hook's tensor.div_(world_size)).
  virtual void divide(float* x, float d, size_t count) = 0;
  // Whether every one of the count values is finite (no NaN, no infinity): a gradient's test
  // before it is reduced. The answer comes to the host.
  virtual bool all_finite(const float* x, size_t count) = 0;
  // all_finite of several buffers (xs[i], counts[i] values each) with one answer to the host: the
  // index of the first that is not, -1 when every one is. The default asks all_finite of each in
  // turn.
  virtual int first_nonfinite(const std::vector<const float*>& xs, const std::vector<size_t>& counts) {
    for (size_t i = 0; i < xs.size(); ++i)
      if (!all_finite(xs[i], counts[i])) return static_cast<int>(i);
    return -1;
  }
  // `bytes` of this device's memory (a bucket), and its release.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
};

}  // namespace lab
