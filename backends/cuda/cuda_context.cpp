#include "cuda_context.h"

#include "cuda_device.h"
#include "cuda_error.h"

namespace lab::cuda {

CudaContext::CudaContext(const CudaContextOptions& options) : m_opt(options) {
  const CudaProbe probe = cuda_devices();
  if (!probe.ok()) throw DeviceError("no GPU to run on: " + probe.reason, probe.hint);
  if (m_opt.device < 0 || m_opt.device >= static_cast<int>(probe.devices.size()))
    throw DeviceError("GPU " + std::to_string(m_opt.device) + " does not exist: this process sees " +
                          std::to_string(probe.devices.size()) + " (0 to " +
                          std::to_string(probe.devices.size() - 1) + ")",
                      "check `nvidia-smi` and CUDA_VISIBLE_DEVICES");
  // A failure part way leaves the members made so far to the destructor's cleanup, which a
  // constructor that throws does not get: release them here before rethrowing.
  try {
    DTLAB_CUDA_CHECK(cudaSetDevice(m_opt.device));
    DTLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking));
    DTLAB_CUBLAS_CHECK(cublasCreate(&m_cublas));
    DTLAB_CUBLAS_CHECK(cublasSetStream(m_cublas, m_stream));
    const cublasMath_t math = m_opt.matmul_tf32     ? CUBLAS_TF32_TENSOR_OP_MATH
                              : m_opt.gemm_pedantic ? CUBLAS_PEDANTIC_MATH
                                                    : CUBLAS_DEFAULT_MATH;
    DTLAB_CUBLAS_CHECK(cublasSetMathMode(m_cublas, math));
    DTLAB_CUBLAS_CHECK(cublasSetAtomicsMode(m_cublas, CUBLAS_ATOMICS_NOT_ALLOWED));
    DTLAB_CUBLAS_CHECK(cublasSetPointerMode(m_cublas, CUBLAS_POINTER_MODE_HOST));
    DTLAB_CUDNN_CHECK(cudnnCreate(&m_cudnn));
    DTLAB_CUDNN_CHECK(cudnnSetStream(m_cudnn, m_stream));
  } catch (...) {
    if (m_cudnn) cudnnDestroy(m_cudnn);
    if (m_cublas) cublasDestroy(m_cublas);
    if (m_stream) cudaStreamDestroy(m_stream);
    throw;
  }
}

CudaContext::~CudaContext() {
  // Destructors do not throw: errors here would have shown at the last synchronize().
  cudaSetDevice(m_opt.device);
  if (m_stream) cudaStreamSynchronize(m_stream);
  m_workspace = DeviceBuffer<unsigned char>();
  if (m_cudnn) cudnnDestroy(m_cudnn);
  if (m_cublas) cublasDestroy(m_cublas);
  if (m_stream) cudaStreamDestroy(m_stream);
}

void CudaContext::make_current() const { DTLAB_CUDA_CHECK(cudaSetDevice(m_opt.device)); }

void CudaContext::synchronize() const {
  DTLAB_CUDA_CHECK(cudaStreamSynchronize(m_stream));
  DTLAB_CUDA_CHECK(cudaGetLastError());
}

void* CudaContext::workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > m_workspace.size()) {
    // The old workspace may still be in use by queued work: wait before freeing it.
    synchronize();
    m_workspace.resize(bytes);
  }
  return m_workspace.data();
}

}  // namespace lab::cuda
