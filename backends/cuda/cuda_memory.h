// A GPU's memory as the collectives see it (lab/comm/device_memory.h), over one rank's context:
// its copies are device-to-device copies on the rank's stream, its reduction a kernel that adds in
// index order (add_into, cuda_ops.h: the CPU's bits), and each call waits for the stream, so that
// a peer rank (another thread, its own stream) may read the result as soon as the transport says
// so. Emulated ranks on one GPU share the device's memory: a rank's copy reads its neighbour's
// buffer directly (the threads transport, Transport::device_aware).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_context.h"
#include "device_buffer.h"
#include "device_memory.h"

namespace lab::cuda {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(CudaContext& ctx) : m_ctx(ctx) {}
  ~CudaDeviceMemory() override;
  CudaDeviceMemory(const CudaDeviceMemory&) = delete;
  CudaDeviceMemory& operator=(const CudaDeviceMemory&) = delete;
  std::string name() const override { return "cuda:" + std::to_string(m_ctx.device()); }
  void copy(void* dst, const void* src, size_t bytes) override;
  void add(float* acc, const float* in, size_t count) override;
  void download(void* host, const void* device, size_t bytes) override;
  void upload(void* device, const void* host, size_t bytes) override;
  void scale(float* x, float k, size_t count) override;
  void divide(float* x, float d, size_t count) override;
  bool all_finite(const float* x, size_t count) override;
  // a flag per buffer on the device, one download of them all
  int first_nonfinite(const std::vector<const float*>& xs, const std::vector<size_t>& counts) override;
  void* allocate(size_t bytes) override;
  void release(void* p) override;

 private:
  CudaContext& m_ctx;
  int32_t* m_flag = nullptr;  // all_finite's answer on the device (allocated on first use)
  DeviceBuffer<int32_t> m_flags;  // first_nonfinite's, one per buffer
  std::vector<int32_t> m_flags_host;
};

}  // namespace lab::cuda
