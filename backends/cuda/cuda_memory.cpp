#include "cuda_memory.h"

#include <cuda_runtime.h>

#include "cuda_error.h"
#include "cuda_ops.h"

namespace lab::cuda {

// Every call may come from a thread other than the one that made the context (a rank's
// communication thread): the device is made current first.

void CudaDeviceMemory::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  m_ctx.make_current();
  DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, m_ctx.stream()));
  m_ctx.synchronize();
}

void CudaDeviceMemory::add(float* acc, const float* in, size_t count) {
  if (count == 0) return;
  m_ctx.make_current();
  add_into(m_ctx, acc, in, static_cast<int64_t>(count));
  m_ctx.synchronize();
}

void CudaDeviceMemory::download(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return;
  m_ctx.make_current();
  DTLAB_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, m_ctx.stream()));
  m_ctx.synchronize();
}

void CudaDeviceMemory::upload(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  m_ctx.make_current();
  DTLAB_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, m_ctx.stream()));
  m_ctx.synchronize();
}

void CudaDeviceMemory::scale(float* x, float k, size_t count) {
  if (count == 0) return;
  m_ctx.make_current();
  scale_inplace(m_ctx, x, k, static_cast<int64_t>(count));
  m_ctx.synchronize();
}

void CudaDeviceMemory::divide(float* x, float d, size_t count) {
  if (count == 0) return;
  m_ctx.make_current();
  divide_inplace(m_ctx, x, d, static_cast<int64_t>(count));
  m_ctx.synchronize();
}

bool CudaDeviceMemory::all_finite(const float* x, size_t count) {
  if (count == 0) return true;
  m_ctx.make_current();
  if (!m_flag) DTLAB_CUDA_CHECK(cudaMalloc(&m_flag, sizeof(int32_t)));
  int32_t bad = 0;
  count_nonfinite(m_ctx, x, static_cast<int64_t>(count), m_flag);
  DTLAB_CUDA_CHECK(cudaMemcpyAsync(&bad, m_flag, sizeof bad, cudaMemcpyDeviceToHost, m_ctx.stream()));
  m_ctx.synchronize();
  return bad == 0;
}

int CudaDeviceMemory::first_nonfinite(const std::vector<const float*>& xs, const std::vector<size_t>& counts) {
  if (xs.empty()) return -1;
  m_ctx.make_current();
  m_flags.resize(xs.size());
  nonfinite_flags(m_ctx, xs, std::vector<int64_t>(counts.begin(), counts.end()), m_flags.data());
  m_flags_host.resize(xs.size());
  DTLAB_CUDA_CHECK(cudaMemcpyAsync(m_flags_host.data(), m_flags.data(), xs.size() * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, m_ctx.stream()));
  m_ctx.synchronize();
  for (size_t i = 0; i < xs.size(); ++i)
    if (m_flags_host[i]) return static_cast<int>(i);
  return -1;
}

void* CudaDeviceMemory::allocate(size_t bytes) {
  m_ctx.make_current();
  void* p = nullptr;
  DTLAB_CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
  return p;
}

void CudaDeviceMemory::release(void* p) {
  if (!p) return;
  m_ctx.make_current();
  static_cast<void>(cudaFree(p));  // errors ignored: called from destructors
}

CudaDeviceMemory::~CudaDeviceMemory() { release(m_flag); }

}  // namespace lab::cuda
