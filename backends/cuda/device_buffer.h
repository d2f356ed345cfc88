// DeviceBuffer<T>: an owning array in GPU memory (cudaMalloc/cudaFree), move-only, with copies
// to and from host memory on a stream. Sizes are element counts.
//
//   DeviceBuffer<float> x(n);                 // (n,) uninitialized
//   x.upload(host.data(), n, ctx.stream());   // host -> device, ordered on the stream
//   x.fill_bytes(0xFF, ctx.stream());         // every float a NaN (tests poison outputs this way)
//   std::vector<float> back = x.download(ctx.stream());   // device -> host, waits for the stream
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda_error.h"

namespace lab::cuda {

// Every new allocation of a DeviceBuffer (its first, or a growth, which frees the old one), in the
// process: a captured CUDA Graph holds the addresses it was captured with, so one captured before
// the count moved may point at freed memory (cuda_executor.cpp: --cuda-graphs recaptures then).
inline std::atomic<uint64_t>& device_buffer_allocations() {
  static std::atomic<uint64_t> count{0};
  return count;
}

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { resize(count); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : m_data(std::exchange(o.m_data, nullptr)), m_size(std::exchange(o.m_size, 0)),
        m_capacity(std::exchange(o.m_capacity, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      m_data = std::exchange(o.m_data, nullptr);
      m_size = std::exchange(o.m_size, 0);
      m_capacity = std::exchange(o.m_capacity, 0);
    }
    return *this;
  }

  // count elements; reallocates only to grow (contents are then unspecified), never shrinks.
  void resize(size_t count) {
    if (count > m_capacity) {
      release();
      void* p = nullptr;
      DTLAB_CUDA_CHECK(cudaMalloc(&p, count * sizeof(T)));
      m_data = static_cast<T*>(p);
      m_capacity = count;
      device_buffer_allocations().fetch_add(1, std::memory_order_relaxed);
    }
    m_size = count;
  }

  T* data() { return m_data; }
  const T* data() const { return m_data; }
  size_t size() const { return m_size; }
  size_t bytes() const { return m_size * sizeof(T); }

  // host (count,) -> this[0, count), ordered on stream. From pageable memory the copy is staged,
  // so `host` may be reused once this returns.
  void upload(const T* host, size_t count, cudaStream_t stream) {
    assert(count <= m_size);
    if (count == 0) return;
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(m_data, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
  }
  void upload(const std::vector<T>& host, cudaStream_t stream) {
    resize(host.size());
    upload(host.data(), host.size(), stream);
  }
  // this[0, count) -> host (count,), after the work queued on stream; waits until it is there.
  void download(T* host, size_t count, cudaStream_t stream) const {
    assert(count <= m_size);
    if (count == 0) return;
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(host, m_data, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
    DTLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  std::vector<T> download(cudaStream_t stream) const {
    std::vector<T> host(m_size);
    download(host.data(), m_size, stream);
    return host;
  }
  // Every byte set to `byte`, ordered on stream: 0 gives zeros, 0xFF gives NaN floats.
  void fill_bytes(int byte, cudaStream_t stream) {
    if (m_size == 0) return;
    DTLAB_CUDA_CHECK(cudaMemsetAsync(m_data, byte, bytes(), stream));
  }

 private:
  void release() noexcept {
    if (m_data) cudaFree(m_data);  // a destructor does not throw: a failure here is reported by the next call
    m_data = nullptr;
    m_size = m_capacity = 0;
  }

  T* m_data = nullptr;
  size_t m_size = 0;
  size_t m_capacity = 0;
};

}  // namespace lab::cuda
