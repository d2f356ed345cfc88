#include "cuda_conv.h"

#include <utility>
#include <vector>

#include "cuda_error.h"

namespace lab::cuda {

namespace {

const char* const kFwdNames[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                 "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
const char* const kBwdDataNames[] = {"0", "1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
const char* const kBwdFilterNames[] = {"0", "1", "FFT", "3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};

template <size_t N>
std::string algo_name(const char* prefix, const char* const (&names)[N], int algo) {
  if (algo < 0 || algo >= static_cast<int>(N)) return std::string(prefix) + "?" + std::to_string(algo);
  return std::string(prefix) + names[algo];
}

// The shape in error messages and records: "conv (64, 32, 14, 14) k3 p1 -> 64".
std::string describe(const Conv2dShape& s) {
  return "conv (" + std::to_string(s.n) + ", " + std::to_string(s.cin) + ", " + std::to_string(s.h) + ", " +
         std::to_string(s.w) + ") k" + std::to_string(s.k) + " p" + std::to_string(s.pad) + " -> " +
         std::to_string(s.cout);
}

const char* math_name(cudnnMathType_t m) { return m == CUDNN_FMA_MATH ? "FMA" : "TF32"; }

// What the chooser needs from one pass (forward, backward data, backward filter): cuDNN's three
// functions have the same shape with different types, so each pass fills one of these.
struct Candidate {
  int algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
  cudnnDeterminism_t determinism;
  cudnnMathType_t math;
};

template <class Perf>
std::vector<Candidate> candidates_of(const std::vector<Perf>& perf, int returned) {
  std::vector<Candidate> out;
  for (int i = 0; i < returned; ++i)
    out.push_back({static_cast<int>(perf[static_cast<size_t>(i)].algo), perf[static_cast<size_t>(i)].status,
                   perf[static_cast<size_t>(i)].time, perf[static_cast<size_t>(i)].memory,
                   perf[static_cast<size_t>(i)].determinism, perf[static_cast<size_t>(i)].mathType});
  return out;
}

struct Choice {
  int algo = -1;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_FMA_MATH;
  bool deterministic = true;
  float time_ms = -1.0f;
};

// The first candidate, in cuDNN's order (fastest first for Find, best guess first for the
// heuristics), that succeeded, is deterministic when asked, and whose workspace under the math
// type we run it with fits the limit. workspace_of(algo, &bytes) asks cuDNN after the math type is
// set on conv.
template <class WorkspaceOf>
Choice pick(const std::vector<Candidate>& cands, const CudaContextOptions& opt, cudnnConvolutionDescriptor_t conv,
            bool timed, WorkspaceOf workspace_of) {
  for (const Candidate& c : cands) {
    if (c.status != CUDNN_STATUS_SUCCESS) continue;
    if (opt.cudnn_deterministic && c.determinism != CUDNN_DETERMINISTIC) continue;
    const cudnnMathType_t math = opt.conv_tf32 ? c.math : CUDNN_FMA_MATH;
    if (cudnnSetConvolutionMathType(conv, math) != CUDNN_STATUS_SUCCESS) continue;
    size_t bytes = 0;
    if (workspace_of(c.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > opt.workspace_limit) continue;
    Choice ch;
    ch.algo = c.algo;
    ch.workspace = bytes;
    ch.math = math;
    ch.deterministic = c.determinism == CUDNN_DETERMINISTIC;
    ch.time_ms = timed ? c.time : -1.0f;
    return ch;
  }
  return {};
}

// One pass's choice: `forced` (>= 0) as given, with `forced_deterministic` from cuDNN's header; else
// the first candidate pick() accepts among list(max, &got, perf) (cudnnFind* when benchmarking,
// the heuristics otherwise; max from max_count(&max)). The pass's three cuDNN functions are the
// lambdas, which check their own calls; Choice::algo < 0: none qualifies.
template <class Perf, class WorkspaceOf, class MaxCount, class List>
Choice choose_pass(int forced, bool forced_deterministic, cudnnConvolutionDescriptor_t conv,
                   const CudaContextOptions& opt, WorkspaceOf workspace_of, MaxCount max_count, List list) {
  if (forced >= 0) {
    Choice ch;
    ch.algo = forced;
    ch.math = opt.conv_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    ch.deterministic = forced_deterministic;
    DTLAB_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, ch.math));
    DTLAB_CUDNN_CHECK(workspace_of(ch.algo, &ch.workspace));
    return ch;
  }
  int max = 0, got = 0;
  max_count(&max);
  std::vector<Perf> perf(static_cast<size_t>(max));
  list(max, &got, perf.data());
  return pick(candidates_of(perf, got), opt, conv, opt.cudnn_benchmark, workspace_of);
}

}  // namespace

std::string cudnn_fwd_algo_name(int algo) { return algo_name("CUDNN_CONVOLUTION_FWD_ALGO_", kFwdNames, algo); }
std::string cudnn_bwd_data_algo_name(int algo) {
  return algo_name("CUDNN_CONVOLUTION_BWD_DATA_ALGO_", kBwdDataNames, algo);
}
std::string cudnn_bwd_filter_algo_name(int algo) {
  return algo_name("CUDNN_CONVOLUTION_BWD_FILTER_ALGO_", kBwdFilterNames, algo);
}

CudnnConv2d::CudnnConv2d(CudaContext& ctx, const Conv2dShape& shape, const ConvAlgoForce& force)
    : m_ctx(ctx), m_shape(shape) {
  const Conv2dShape& s = m_shape;
  if (s.n <= 0 || s.cin <= 0 || s.cout <= 0 || s.k <= 0 || s.pad < 0 || s.ho() <= 0 || s.wo() <= 0)
    throw DeviceError("CudnnConv2d: invalid shape " + describe(s), "a bug in the caller: every size must be positive");
  try {
    DTLAB_CUDNN_CHECK(cudnnCreateTensorDescriptor(&m_x));
    DTLAB_CUDNN_CHECK(cudnnCreateTensorDescriptor(&m_y));
    DTLAB_CUDNN_CHECK(cudnnCreateFilterDescriptor(&m_w));
    DTLAB_CUDNN_CHECK(cudnnSetTensor4dDescriptor(m_x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s.n, s.cin, s.h, s.w));
    DTLAB_CUDNN_CHECK(cudnnSetTensor4dDescriptor(m_y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, s.n, s.cout, s.ho(), s.wo()));
    DTLAB_CUDNN_CHECK(cudnnSetFilter4dDescriptor(m_w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, s.cout, s.cin, s.k, s.k));
    for (cudnnConvolutionDescriptor_t* d : {&m_fwd_conv, &m_bwd_data_conv, &m_bwd_filter_conv}) {
      DTLAB_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(d));
      // PyTorch: cross-correlation, fp32 compute; FMA math unless TF32 is allowed
      DTLAB_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(*d, s.pad, s.pad, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                                        CUDNN_DATA_FLOAT));
      DTLAB_CUDNN_CHECK(cudnnSetConvolutionMathType(*d, ctx.options().conv_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    }
    int n = 0, c = 0, h = 0, w = 0;
    DTLAB_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(m_fwd_conv, m_x, m_w, &n, &c, &h, &w));
    if (n != s.n || c != s.cout || h != s.ho() || w != s.wo())
      throw DeviceError("cuDNN computes another output shape for " + describe(s), "a bug in CudnnConv2d");
    choose(force);
  } catch (...) {
    release();  // a constructor that throws gets no destructor call
    throw;
  }
}

CudnnConv2d::~CudnnConv2d() { release(); }

void CudnnConv2d::release() noexcept {
  for (cudnnConvolutionDescriptor_t* d : {&m_fwd_conv, &m_bwd_data_conv, &m_bwd_filter_conv})
    if (*d) cudnnDestroyConvolutionDescriptor(std::exchange(*d, nullptr));
  if (m_w) cudnnDestroyFilterDescriptor(std::exchange(m_w, nullptr));
  if (m_y) cudnnDestroyTensorDescriptor(std::exchange(m_y, nullptr));
  if (m_x) cudnnDestroyTensorDescriptor(std::exchange(m_x, nullptr));
}

void CudnnConv2d::choose(const ConvAlgoForce& force) {
  const CudaContextOptions& opt = m_ctx.options();
  cudnnHandle_t h = m_ctx.cudnn();
  const std::string how = opt.cudnn_benchmark ? "benchmark" : "heuristic";
  const std::string layer = describe(m_shape);
  const std::string none = ": no cuDNN algorithm qualifies (" +
                           std::string(opt.cudnn_deterministic ? "deterministic, " : "") + "workspace within " +
                           std::to_string(opt.workspace_limit >> 20) + " MiB)";
  const std::string hint = "raise the workspace limit, or allow non-deterministic algorithms";
  auto record = [&](ConvAlgoRecord& rec, const char* pass, const std::string& name, const std::string& by, bool det,
                    cudnnMathType_t math, size_t ws, float ms) {
    rec = ConvAlgoRecord{layer, pass, name, by, det, math_name(math), ws, ms};
    m_ctx.record_conv_algorithm(rec);
  };

  // ---- forward ---- (every forward algorithm is deterministic)
  {
    const Choice ch = choose_pass<cudnnConvolutionFwdAlgoPerf_t>(
        force.forward, true, m_fwd_conv, opt,
        [&](int algo, size_t* bytes) {
          return cudnnGetConvolutionForwardWorkspaceSize(h, m_x, m_w, m_fwd_conv, m_y,
                                                         static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
        },
        [&](int* max) { DTLAB_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, max)); },
        [&](int max, int* got, cudnnConvolutionFwdAlgoPerf_t* perf) {
          if (opt.cudnn_benchmark)
            DTLAB_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, m_x, m_w, m_fwd_conv, m_y, max, got, perf));
          else
            DTLAB_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, m_x, m_w, m_fwd_conv, m_y, max, got, perf));
        });
    if (ch.algo < 0) throw DeviceError("forward of " + layer + none, hint);
    m_fwd_algo = static_cast<cudnnConvolutionFwdAlgo_t>(ch.algo);
    m_fwd_ws = ch.workspace;
    record(m_fwd_rec, "forward", cudnn_fwd_algo_name(ch.algo), force.forward >= 0 ? "forced" : how, true, ch.math,
           ch.workspace, ch.time_ms);
  }

  // ---- backward data ---- (cuDNN's header marks ALGO_0 non-deterministic: it adds with atomics)
  {
    const Choice ch = choose_pass<cudnnConvolutionBwdDataAlgoPerf_t>(
        force.backward_data, force.backward_data != CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, m_bwd_data_conv, opt,
        [&](int algo, size_t* bytes) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(h, m_w, m_y, m_bwd_data_conv, m_x,
                                                              static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
        },
        [&](int* max) { DTLAB_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, max)); },
        [&](int max, int* got, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
          if (opt.cudnn_benchmark)
            DTLAB_CUDNN_CHECK(
                cudnnFindConvolutionBackwardDataAlgorithm(h, m_w, m_y, m_bwd_data_conv, m_x, max, got, perf));
          else
            DTLAB_CUDNN_CHECK(
                cudnnGetConvolutionBackwardDataAlgorithm_v7(h, m_w, m_y, m_bwd_data_conv, m_x, max, got, perf));
        });
    if (ch.algo < 0) throw DeviceError("backward data of " + layer + none, hint);
    m_bwd_data_algo = static_cast<cudnnConvolutionBwdDataAlgo_t>(ch.algo);
    m_bwd_data_ws = ch.workspace;
    record(m_bwd_data_rec, "backward_data", cudnn_bwd_data_algo_name(ch.algo),
           force.backward_data >= 0 ? "forced" : how, ch.deterministic, ch.math, ch.workspace, ch.time_ms);
  }

  // ---- backward filter ---- (ALGO_0 and ALGO_3 are the non-deterministic ones)
  {
    const Choice ch = choose_pass<cudnnConvolutionBwdFilterAlgoPerf_t>(
        force.backward_filter,
        force.backward_filter != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 &&
            force.backward_filter != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
        m_bwd_filter_conv, opt,
        [&](int algo, size_t* bytes) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(
              h, m_x, m_y, m_bwd_filter_conv, m_w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
        },
        [&](int* max) { DTLAB_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, max)); },
        [&](int max, int* got, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
          if (opt.cudnn_benchmark)
            DTLAB_CUDNN_CHECK(
                cudnnFindConvolutionBackwardFilterAlgorithm(h, m_x, m_y, m_bwd_filter_conv, m_w, max, got, perf));
          else
            DTLAB_CUDNN_CHECK(
                cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, m_x, m_y, m_bwd_filter_conv, m_w, max, got, perf));
        });
    if (ch.algo < 0) throw DeviceError("backward filter of " + layer + none, hint);
    m_bwd_filter_algo = static_cast<cudnnConvolutionBwdFilterAlgo_t>(ch.algo);
    m_bwd_filter_ws = ch.workspace;
    record(m_bwd_filter_rec, "backward_filter", cudnn_bwd_filter_algo_name(ch.algo),
           force.backward_filter >= 0 ? "forced" : how, ch.deterministic, ch.math, ch.workspace, ch.time_ms);
  }
}

void CudnnConv2d::forward(const float* x, const float* w, float* y) {
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = m_ctx.workspace(m_fwd_ws);
  DTLAB_CUDNN_CHECK(cudnnConvolutionForward(m_ctx.cudnn(), &alpha, m_x, x, m_w, w, m_fwd_conv, m_fwd_algo, ws, m_fwd_ws,
                                            &beta, m_y, y));
}

void CudnnConv2d::backward_data(const float* w, const float* dy, float* dx) {
  const float alpha = 1.0f, beta = 0.0f;
  void* ws = m_ctx.workspace(m_bwd_data_ws);
  DTLAB_CUDNN_CHECK(cudnnConvolutionBackwardData(m_ctx.cudnn(), &alpha, m_w, w, m_y, dy, m_bwd_data_conv,
                                                 m_bwd_data_algo, ws, m_bwd_data_ws, &beta, m_x, dx));
}

void CudnnConv2d::backward_filter(const float* x, const float* dy, float* dw, float beta) {
  const float alpha = 1.0f;
  void* ws = m_ctx.workspace(m_bwd_filter_ws);
  DTLAB_CUDNN_CHECK(cudnnConvolutionBackwardFilter(m_ctx.cudnn(), &alpha, m_x, x, m_y, dy, m_bwd_filter_conv,
                                                   m_bwd_filter_algo, ws, m_bwd_filter_ws, &beta, m_w, dw));
}

}  // namespace lab::cuda
