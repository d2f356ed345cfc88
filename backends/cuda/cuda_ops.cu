// Kernels of cuda_ops.h. Built with --fmad=false (CMakeLists.txt): a * b + c stays two roundings,
// as in the CPU layers (-ffp-contract=off), so elementwise.h's formulas give the CPU's bits.
//
// Sections: launch helpers and the block sum | bias | ReLU | max-pool | BatchNorm | cross-entropy |
// SGD
#include <algorithm>
#include <cassert>

#include "cuda_error.h"
#include "cuda_ops.h"
#include "elementwise.h"

namespace lab::cuda {

namespace {

// ---- launch helpers and the block sum ----

constexpr int kThreads = 256;     // elementwise kernels
constexpr int64_t kMaxBlocks = 4096;  // elementwise kernels loop over the rest (grid-stride)

int blocks_for(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

// Grid-stride index loop: every index in [0, count) exactly once.
#define DTLAB_FOR_EACH(i, count)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// The sum of every thread's v over one block of kReduceThreads threads, in a fixed binary tree
// (shared[t] += shared[t + s] for s = 128, 64, ..., 1): the same order in every run. Every thread
// gets the total.
__device__ double block_sum(double v, double* shared) {
  const int t = threadIdx.x;
  shared[t] = v;
  __syncthreads();
  for (int s = kReduceThreads / 2; s > 0; s >>= 1) {
    if (t < s) shared[t] += shared[t + s];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // shared may be reused right after
  return total;
}

// Value j of channel ch, j in [0, nb * inner), in the order the CPU visits them: sample by sample,
// each sample's run of inner values in order.
__device__ inline int64_t channel_index(int64_t j, int64_t ch, int64_t c, int64_t inner) {
  const int64_t b = j / inner;
  return (b * c + ch) * inner + (j - b * inner);
}

// ---- bias ----

__global__ void bias_add_kernel(float* y, const float* b, int64_t count, int64_t c, int64_t inner) {
  DTLAB_FOR_EACH(i, count) y[i] = y[i] + b[(i / inner) % c];
}

// One block per channel.
__global__ void bias_grad_kernel(const float* dy, float* db, int64_t nb, int64_t c, int64_t inner) {
  __shared__ double shared[kReduceThreads];
  const int64_t ch = blockIdx.x, n = nb * inner;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += kReduceThreads) s += dy[channel_index(j, ch, c, inner)];
  const double total = block_sum(s, shared);
  if (threadIdx.x == 0) db[ch] += static_cast<float>(total);
}

// ---- ReLU ----

__global__ void relu_forward_kernel(const float* x, float* y, uint8_t* mask, int64_t count) {
  DTLAB_FOR_EACH(i, count) {
    const float v = x[i];
    y[i] = relu_value(v);
    mask[i] = relu_passes(v);
  }
}

__global__ void add_into_kernel(float* acc, const float* in, int64_t count) {
  DTLAB_FOR_EACH(i, count) acc[i] += in[i];
}

__global__ void scale_kernel(float* x, float k, int64_t count) {
  DTLAB_FOR_EACH(i, count) x[i] *= k;
}

__global__ void divide_kernel(float* x, float d, int64_t count) {
  DTLAB_FOR_EACH(i, count) x[i] = __fdiv_rn(x[i], d);  // IEEE division, as the CPU's
}

__global__ void nonfinite_kernel(const float* x, int64_t count, int32_t* bad) {
  int found = 0;
  DTLAB_FOR_EACH(i, count) found |= !isfinite(x[i]);
  if (found) atomicOr(bad, 1);
}

__global__ void relu_backward_kernel(const float* dy, const uint8_t* mask, float* dx, int64_t count) {
  DTLAB_FOR_EACH(i, count) dx[i] = relu_grad(dy[i], mask[i] != 0);
}

// ---- max-pool ----

// One thread per output.
__global__ void maxpool2x2_forward_kernel(const float* x, float* y, int32_t* argmax, int64_t planes, int h, int w) {
  const int ho = h / 2, wo = w / 2;
  const int64_t count = planes * ho * wo;
  DTLAB_FOR_EACH(o, count) {
    const int64_t p = o / (ho * wo);
    const int r = static_cast<int>(o - p * ho * wo);
    const int oh = r / wo, ow = r - oh * wo;
    const int top = 2 * oh * w + 2 * ow;  // index of `a` within the plane
    const float* in = x + p * h * w;
    const float a = in[top], b = in[top + 1], c = in[top + w], d = in[top + w + 1];
    const int place = pool2x2_place(a, b, c, d);
    y[o] = place == 0 ? a : place == 1 ? b : place == 2 ? c : d;
    argmax[o] = top + (place >> 1) * w + (place & 1);
  }
}

// One thread per input: its window's winner gets 0 + dy (as the CPU's scatter onto zeros), the
// other inputs 0. Windows do not overlap (stride 2), so no two threads write one value.
__global__ void maxpool2x2_backward_kernel(const float* dy, const int32_t* argmax, float* dx, int64_t planes, int h,
                                           int w) {
  const int ho = h / 2, wo = w / 2;
  const int64_t count = planes * h * w;
  DTLAB_FOR_EACH(i, count) {
    const int64_t p = i / (static_cast<int64_t>(h) * w);
    const int r = static_cast<int>(i - p * h * w);
    const int ih = r / w, iw = r - ih * w;
    float v = 0.0f;
    if (ih < 2 * ho && iw < 2 * wo) {
      const int64_t o = p * ho * wo + (ih / 2) * wo + iw / 2;
      if (argmax[o] == r) v = 0.0f + dy[o];
    }
    dx[i] = v;
  }
}

// ---- BatchNorm ----

// One block per channel: the sum, the mean, then the squared deviations from that mean.
__global__ void bn_stats_kernel(const float* x, int64_t nb, int64_t c, int64_t inner, float* mean, float* var_sum,
                                float* var) {
  __shared__ double shared[kReduceThreads];
  const int64_t ch = blockIdx.x, n = nb * inner;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += kReduceThreads) s += x[channel_index(j, ch, c, inner)];
  const float m = bn_mean(block_sum(s, shared), n);
  double q = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += kReduceThreads) q += bn_sq_dev(x[channel_index(j, ch, c, inner)], m);
  const float vs = static_cast<float>(block_sum(q, shared));
  if (threadIdx.x == 0) {
    mean[ch] = m;
    var_sum[ch] = vs;
    var[ch] = bn_biased_var(vs, n);
  }
}

__global__ void bn_running_kernel(const float* mean, const float* var_sum, int64_t count, float m, float* running_mean,
                                  float* running_var, int64_t c) {
  DTLAB_FOR_EACH(ch, c) lab::bn_running_update(running_mean[ch], running_var[ch], mean[ch], var_sum[ch], count, m);
}

__global__ void bn_coefficients_kernel(const float* mean, const float* var, const float* weight, const float* bias,
                                       double eps, int64_t c, float* invstd, float* alpha, float* beta) {
  DTLAB_FOR_EACH(ch, c) {
    const float is = bn_invstd(var[ch], eps);
    const float a = bn_alpha(is, weight ? weight[ch] : 1.0f);
    invstd[ch] = is;
    alpha[ch] = a;
    beta[ch] = bn_beta(bias ? bias[ch] : 0.0f, mean[ch], a);
  }
}

__global__ void bn_eval_coefficients_kernel(const float* running_mean, const float* running_var, const float* weight,
                                            const float* bias, float eps, int64_t c, float* mean, float* invstd,
                                            float* alpha, float* beta) {
  DTLAB_FOR_EACH(ch, c) {
    const float m = running_mean[ch];
    const float is = bn_invstd_running(running_var[ch], eps);
    const float a = bn_alpha(is, weight ? weight[ch] : 1.0f);
    mean[ch] = m;
    invstd[ch] = is;
    alpha[ch] = a;
    beta[ch] = bn_beta(bias ? bias[ch] : 0.0f, m, a);
  }
}

// [mean (c) | var (c) | count]; an empty batch contributes zeros
__global__ void bn_pack_row_kernel(const float* mean, const float* var, float count, int64_t c, float* row) {
  DTLAB_FOR_EACH(i, 2 * c + 1) {
    float v = count;
    if (i < c) v = mean[i];
    else if (i < 2 * c) v = var[i - c];
    row[i] = count > 0.0f ? v : 0.0f;
  }
}

__global__ void bn_combine_kernel(const float* all, int world, int64_t c, bool update, double factor,
                                  float* running_mean, float* running_var, float* mean, float* var) {
  DTLAB_FOR_EACH(ch, c) {
    const BnGlobalStats g = bn_combine_channel(all, world, c, ch);
    if (g.cnt < 1.0) {  // every rank empty: zeros, the running statistics untouched
      mean[ch] = 0.0f;
      var[ch] = 0.0f;
      continue;
    }
    mean[ch] = static_cast<float>(g.avg);
    var[ch] = static_cast<float>(g.m2 / g.cnt);
    if (update) bn_running_update_global(running_mean[ch], running_var[ch], g.avg, g.m2, g.cnt, factor);
  }
}

__global__ void bn_sums_to_float_kernel(const double* sum_dy, const double* sum_dy_xmu, int64_t c, float* out) {
  DTLAB_FOR_EACH(i, 2 * c) out[i] = static_cast<float>(i < c ? sum_dy[i] : sum_dy_xmu[i - c]);
}

__global__ void bn_apply_kernel(const float* x, const float* alpha, const float* beta, float* y, int64_t count,
                                int64_t c, int64_t inner) {
  DTLAB_FOR_EACH(i, count) {
    const int64_t ch = (i / inner) % c;
    y[i] = bn_affine(x[i], alpha[ch], beta[ch]);
  }
}

// One block per channel: sum dy and sum (x - mean) * dy.
__global__ void bn_grad_sums_kernel(const float* dy, const float* x, const float* mean, int64_t nb, int64_t c,
                                    int64_t inner, double* sum_dy, double* sum_dy_xmu) {
  __shared__ double shared[kReduceThreads];
  const int64_t ch = blockIdx.x, n = nb * inner;
  const float m = mean[ch];
  double s = 0.0, t = 0.0;
  for (int64_t j = threadIdx.x; j < n; j += kReduceThreads) {
    const int64_t i = channel_index(j, ch, c, inner);
    s += dy[i];
    t += bn_xmu_dy(x[i], m, dy[i]);
  }
  const double total_dy = block_sum(s, shared);
  const double total_xmu = block_sum(t, shared);
  if (threadIdx.x == 0) {
    sum_dy[ch] = total_dy;
    sum_dy_xmu[ch] = total_xmu;
  }
}

__global__ void bn_backward_coefficients_kernel(const double* sum_dy, const double* sum_dy_xmu, const float* global,
                                                const float* invstd, const float* weight, double count, int64_t c,
                                                float* dweight, float* dbias, float* grad_mean, float* k,
                                                float* scale) {
  DTLAB_FOR_EACH(ch, c) {
    if (dweight) dweight[ch] += bn_weight_grad(sum_dy_xmu[ch], invstd[ch]);
    if (dbias) dbias[ch] += bn_bias_grad(sum_dy[ch]);
    // the sums as they go on SyncBN's wire: rounded to float (and allreduced, where global)
    const float gdy = global ? global[ch] : static_cast<float>(sum_dy[ch]);
    const float gxmu = global ? global[c + ch] : static_cast<float>(sum_dy_xmu[ch]);
    const BnInputGradCoefficients co = bn_input_grad_coefficients(gdy, gxmu, invstd[ch], weight ? weight[ch] : 1.0f, count);
    grad_mean[ch] = co.grad_mean;
    k[ch] = co.k;
    scale[ch] = co.scale;
  }
}

__global__ void bn_input_grad_kernel(const float* dy, const float* x, const float* mean, const float* grad_mean,
                                     const float* k, const float* scale, float* dx, int64_t count, int64_t c,
                                     int64_t inner) {
  DTLAB_FOR_EACH(i, count) {
    const int64_t ch = (i / inner) % c;
    dx[i] = lab::bn_input_grad(dy[i], x[i], grad_mean[ch], mean[ch], k[ch], scale[ch]);
  }
}

// ---- cross-entropy ----

// One block: thread t takes rows t, t + kReduceThreads, ...
__global__ void cross_entropy_kernel(const float* logits, const int32_t* labels, int64_t n, int64_t c, float* loss,
                                     int32_t* correct, float* dlogits) {
  __shared__ double shared[kReduceThreads];
  double total = 0.0, hits = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kReduceThreads) {
    const int64_t label = labels[i];
    assert(label >= 0 && label < c);
    int64_t best = 0;
    total += cross_entropy_row(logits + i * c, c, label, n, dlogits ? dlogits + i * c : nullptr, &best);
    hits += best == label ? 1.0 : 0.0;
  }
  const double sum = block_sum(total, shared);
  const double hit_count = block_sum(hits, shared);  // exact: integers far below 2^53
  if (threadIdx.x == 0) {
    *loss = static_cast<float>(sum / static_cast<double>(n));
    *correct = static_cast<int32_t>(hit_count);
  }
}

// ---- SGD ----

template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
__global__ void sgd_kernel(float* w, const float* g, float* buf, int64_t count, SgdCoeffs k) {
  DTLAB_FOR_EACH(i, count) {
    float unused = 0.0f;  // stands in for the momentum buffer when there is none
    sgd_element<kDecay, kMomentum, kFirst, kNesterov>(w[i], g[i], kMomentum ? buf[i] : unused, k);
  }
}

template <bool kDecay>
void sgd_dispatch(cudaStream_t s, bool momentum, bool first, bool nesterov, float* w, const float* g, float* buf,
                  int64_t count, SgdCoeffs k) {
  const int blocks = blocks_for(count);
  if (!momentum)
    sgd_kernel<kDecay, false, false, false><<<blocks, kThreads, 0, s>>>(w, g, buf, count, k);
  else if (first && nesterov)
    sgd_kernel<kDecay, true, true, true><<<blocks, kThreads, 0, s>>>(w, g, buf, count, k);
  else if (first)
    sgd_kernel<kDecay, true, true, false><<<blocks, kThreads, 0, s>>>(w, g, buf, count, k);
  else if (nesterov)
    sgd_kernel<kDecay, true, false, true><<<blocks, kThreads, 0, s>>>(w, g, buf, count, k);
  else
    sgd_kernel<kDecay, true, false, false><<<blocks, kThreads, 0, s>>>(w, g, buf, count, k);
}

// ---- several tensors per kernel: blockIdx.y picks the tensor, the x blocks stride over it ----
constexpr int kMaxTensors = 48;  // a kernel's parameters stay under 4 KB
struct FlagList {
  const float* x[kMaxTensors];
  int64_t count[kMaxTensors];
};
struct SgdList {
  float* w[kMaxTensors];
  const float* g[kMaxTensors];
  float* buf[kMaxTensors];
  int64_t count[kMaxTensors];
};

__global__ void nonfinite_multi_kernel(FlagList l, int32_t* flags) {
  const int t = blockIdx.y;
  const float* x = l.x[t];
  int found = 0;
  DTLAB_FOR_EACH(i, l.count[t]) found |= !isfinite(x[i]);
  if (found) atomicOr(flags + t, 1);
}

template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
__global__ void sgd_multi_kernel(SgdList l, SgdCoeffs k, const int32_t* skip) {
  if (skip && *skip) return;
  const int t = blockIdx.y;
  float* w = l.w[t];
  const float* g = l.g[t];
  float* buf = l.buf[t];
  DTLAB_FOR_EACH(i, l.count[t]) {
    float unused = 0.0f;
    sgd_element<kDecay, kMomentum, kFirst, kNesterov>(w[i], g[i], kMomentum ? buf[i] : unused, k);
  }
}

template <bool kDecay>
void sgd_multi_dispatch(cudaStream_t s, bool momentum, bool first, bool nesterov, dim3 grid, const SgdList& l,
                        SgdCoeffs k, const int32_t* skip) {
  if (!momentum)
    sgd_multi_kernel<kDecay, false, false, false><<<grid, kThreads, 0, s>>>(l, k, skip);
  else if (first && nesterov)
    sgd_multi_kernel<kDecay, true, true, true><<<grid, kThreads, 0, s>>>(l, k, skip);
  else if (first)
    sgd_multi_kernel<kDecay, true, true, false><<<grid, kThreads, 0, s>>>(l, k, skip);
  else if (nesterov)
    sgd_multi_kernel<kDecay, true, false, true><<<grid, kThreads, 0, s>>>(l, k, skip);
  else
    sgd_multi_kernel<kDecay, true, false, false><<<grid, kThreads, 0, s>>>(l, k, skip);
}

// One thread: a handful of flags (one per parameter).
__global__ void any_flag_kernel(const int32_t* flags, int64_t count, int32_t* any) {
  int32_t a = 0;
  for (int64_t i = 0; i < count; ++i) a |= flags[i] != 0;
  *any = a;
}

template <bool kDecoupled, bool kDecay>
__global__ void adam_kernel(float* w, const float* g, float* m, float* v, int64_t count, AdamCoeffs k) {
  DTLAB_FOR_EACH(i, count) adam_element<kDecoupled, kDecay>(w[i], g[i], m[i], v[i], k);
}

}  // namespace

void bias_add(CudaContext& ctx, float* y, const float* b, int64_t n, int64_t c, int64_t inner) {
  const int64_t count = n * c * inner;
  if (count == 0) return;
  bias_add_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(y, b, count, c, inner);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bias_grad(CudaContext& ctx, const float* dy, float* db, int64_t n, int64_t c, int64_t inner) {
  if (c == 0) return;
  bias_grad_kernel<<<static_cast<unsigned>(c), kReduceThreads, 0, ctx.stream()>>>(dy, db, n, c, inner);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void relu_forward(CudaContext& ctx, const float* x, float* y, uint8_t* mask, int64_t count) {
  if (count == 0) return;
  relu_forward_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(x, y, mask, count);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void add_into(CudaContext& ctx, float* acc, const float* in, int64_t count) {
  if (count == 0) return;
  add_into_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(acc, in, count);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void scale_inplace(CudaContext& ctx, float* x, float k, int64_t count) {
  if (count == 0) return;
  scale_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(x, k, count);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void divide_inplace(CudaContext& ctx, float* x, float d, int64_t count) {
  if (count == 0) return;
  divide_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(x, d, count);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void count_nonfinite(CudaContext& ctx, const float* x, int64_t count, int32_t* bad) {
  DTLAB_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int32_t), ctx.stream()));
  if (count == 0) return;
  nonfinite_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(x, count, bad);
  DTLAB_CUDA_CHECK_LAUNCH();
}

namespace {

// The tensors in runs of at most kMaxTensors, one kernel each: f(first, n, grid), grid's y the run's
// tensors and its x enough blocks for the largest.
template <class F>
void for_each_run(const std::vector<int64_t>& counts, F&& f) {
  for (size_t first = 0; first < counts.size(); first += kMaxTensors) {
    const size_t n = std::min(counts.size() - first, static_cast<size_t>(kMaxTensors));
    const auto run = counts.begin() + static_cast<std::ptrdiff_t>(first);
    const int64_t most = std::max<int64_t>(1, *std::max_element(run, run + static_cast<std::ptrdiff_t>(n)));
    f(first, n, dim3(static_cast<unsigned>(blocks_for(most)), static_cast<unsigned>(n)));
  }
}

}  // namespace

void nonfinite_flags(CudaContext& ctx, const std::vector<const float*>& xs, const std::vector<int64_t>& counts,
                     int32_t* flags) {
  if (xs.empty()) return;
  DTLAB_CUDA_CHECK(cudaMemsetAsync(flags, 0, xs.size() * sizeof(int32_t), ctx.stream()));
  for_each_run(counts, [&](size_t first, size_t n, dim3 grid) {
    FlagList l{};
    for (size_t t = 0; t < n; ++t) l.x[t] = xs[first + t], l.count[t] = counts[first + t];
    nonfinite_multi_kernel<<<grid, kThreads, 0, ctx.stream()>>>(l, flags + first);
    DTLAB_CUDA_CHECK_LAUNCH();
  });
}

void sgd_step_multi(CudaContext& ctx, const std::vector<float*>& w, const std::vector<const float*>& g,
                    const std::vector<float*>& buf, const std::vector<int64_t>& counts, const SgdOptions& opt, bool first,
                    const int32_t* skip) {
  const SgdCoeffs k = sgd_coeffs(opt.lr, opt.momentum, opt.dampening, opt.weight_decay);
  const bool momentum = opt.momentum != 0.0;
  assert(!momentum || buf.size() == w.size());
  for_each_run(counts, [&](size_t first_t, size_t n, dim3 grid) {
    SgdList l{};
    for (size_t t = 0; t < n; ++t) {
      l.w[t] = w[first_t + t];
      l.g[t] = g[first_t + t];
      l.buf[t] = momentum ? buf[first_t + t] : nullptr;
      l.count[t] = counts[first_t + t];
    }
    // weight_decay == 0 skips the add entirely (as PyTorch does), so an inf weight stays inf.
    if (opt.weight_decay != 0.0)
      sgd_multi_dispatch<true>(ctx.stream(), momentum, first, opt.nesterov, grid, l, k, skip);
    else
      sgd_multi_dispatch<false>(ctx.stream(), momentum, first, opt.nesterov, grid, l, k, skip);
    DTLAB_CUDA_CHECK_LAUNCH();
  });
}

void any_flag(CudaContext& ctx, const int32_t* flags, int64_t count, int32_t* any) {
  any_flag_kernel<<<1, 1, 0, ctx.stream()>>>(flags, count, any);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void relu_backward(CudaContext& ctx, const float* dy, const uint8_t* mask, float* dx, int64_t count) {
  if (count == 0) return;
  relu_backward_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(dy, mask, dx, count);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void maxpool2x2_forward(CudaContext& ctx, const float* x, float* y, int32_t* argmax, int64_t planes, int h, int w) {
  const int64_t count = planes * (h / 2) * (w / 2);
  if (count == 0) return;
  maxpool2x2_forward_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(x, y, argmax, planes, h, w);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void maxpool2x2_backward(CudaContext& ctx, const float* dy, const int32_t* argmax, float* dx, int64_t planes, int h,
                         int w) {
  const int64_t count = planes * h * w;
  if (count == 0) return;
  maxpool2x2_backward_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(dy, argmax, dx, planes, h, w);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_batch_stats(CudaContext& ctx, const float* x, int64_t n, int64_t c, int64_t inner, float* mean,
                    float* var_sum, float* var) {
  if (c == 0) return;
  if (n * inner == 0) {
    // the CPU layer's empty batch: zeros
    for (float* p : {mean, var_sum, var}) DTLAB_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(float) * c, ctx.stream()));
    return;
  }
  bn_stats_kernel<<<static_cast<unsigned>(c), kReduceThreads, 0, ctx.stream()>>>(x, n, c, inner, mean, var_sum, var);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_running_update(CudaContext& ctx, const float* mean, const float* var_sum, int64_t count, float m,
                       float* running_mean, float* running_var, int64_t c) {
  if (c == 0) return;
  assert(count > 0);  // (1 only where a lesson's mutation lets a batch of one through: the CPU's inf)
  bn_running_kernel<<<blocks_for(c), kThreads, 0, ctx.stream()>>>(mean, var_sum, count, m, running_mean, running_var,
                                                                   c);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_forward_coefficients(CudaContext& ctx, const float* mean, const float* var, const float* weight,
                             const float* bias, double eps, int64_t c, float* invstd, float* alpha, float* beta) {
  if (c == 0) return;
  bn_coefficients_kernel<<<blocks_for(c), kThreads, 0, ctx.stream()>>>(mean, var, weight, bias, eps, c, invstd, alpha,
                                                                        beta);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_eval_coefficients(CudaContext& ctx, const float* running_mean, const float* running_var, const float* weight,
                          const float* bias, float eps, int64_t c, float* mean, float* invstd, float* alpha,
                          float* beta) {
  if (c == 0) return;
  bn_eval_coefficients_kernel<<<blocks_for(c), kThreads, 0, ctx.stream()>>>(running_mean, running_var, weight, bias,
                                                                             eps, c, mean, invstd, alpha, beta);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_pack_row(CudaContext& ctx, const float* mean, const float* var, int64_t count, int64_t c, float* row) {
  bn_pack_row_kernel<<<blocks_for(2 * c + 1), kThreads, 0, ctx.stream()>>>(mean, var, static_cast<float>(count), c,
                                                                            row);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_combine_stats(CudaContext& ctx, const float* all, int world, int64_t c, bool update, double factor,
                      float* running_mean, float* running_var, float* mean, float* var) {
  if (c == 0) return;
  bn_combine_kernel<<<blocks_for(c), kThreads, 0, ctx.stream()>>>(all, world, c, update, factor, running_mean,
                                                                   running_var, mean, var);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_sums_to_float(CudaContext& ctx, const double* sum_dy, const double* sum_dy_xmu, int64_t c, float* out) {
  if (c == 0) return;
  bn_sums_to_float_kernel<<<blocks_for(2 * c), kThreads, 0, ctx.stream()>>>(sum_dy, sum_dy_xmu, c, out);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_apply(CudaContext& ctx, const float* x, const float* alpha, const float* beta, float* y, int64_t n, int64_t c,
              int64_t inner) {
  const int64_t count = n * c * inner;
  if (count == 0) return;
  bn_apply_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(x, alpha, beta, y, count, c, inner);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_grad_sums(CudaContext& ctx, const float* dy, const float* x, const float* mean, int64_t n, int64_t c,
                  int64_t inner, double* sum_dy, double* sum_dy_xmu) {
  if (c == 0) return;
  bn_grad_sums_kernel<<<static_cast<unsigned>(c), kReduceThreads, 0, ctx.stream()>>>(dy, x, mean, n, c, inner, sum_dy,
                                                                                       sum_dy_xmu);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_backward_coefficients(CudaContext& ctx, const double* sum_dy, const double* sum_dy_xmu, const float* global,
                              const float* invstd, const float* weight, int64_t count, int64_t c, float* dweight,
                              float* dbias, float* grad_mean, float* k, float* scale) {
  if (c == 0) return;
  bn_backward_coefficients_kernel<<<blocks_for(c), kThreads, 0, ctx.stream()>>>(
      sum_dy, sum_dy_xmu, global, invstd, weight, static_cast<double>(count), c, dweight, dbias, grad_mean, k, scale);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void bn_input_grad(CudaContext& ctx, const float* dy, const float* x, const float* mean, const float* grad_mean,
                   const float* k, const float* scale, float* dx, int64_t n, int64_t c, int64_t inner) {
  const int64_t count = n * c * inner;
  if (count == 0) return;
  bn_input_grad_kernel<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(dy, x, mean, grad_mean, k, scale, dx, count, c,
                                                                         inner);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void cross_entropy(CudaContext& ctx, const float* logits, const int32_t* labels, int64_t n, int64_t c, float* loss,
                   int32_t* correct, float* dlogits) {
  assert(n > 0 && c > 0);
  cross_entropy_kernel<<<1, kReduceThreads, 0, ctx.stream()>>>(logits, labels, n, c, loss, correct, dlogits);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void sgd_step(CudaContext& ctx, float* w, const float* g, float* buf, int64_t count, const SgdOptions& opt,
              bool first) {
  if (count == 0) return;
  const SgdCoeffs k = sgd_coeffs(opt.lr, opt.momentum, opt.dampening, opt.weight_decay);
  const bool momentum = opt.momentum != 0.0;
  assert(!momentum || buf != nullptr);
  // weight_decay == 0 skips the add entirely (as PyTorch does), so an inf weight stays inf.
  if (opt.weight_decay != 0.0)
    sgd_dispatch<true>(ctx.stream(), momentum, first, opt.nesterov, w, g, buf, count, k);
  else
    sgd_dispatch<false>(ctx.stream(), momentum, first, opt.nesterov, w, g, buf, count, k);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void adam_step(CudaContext& ctx, float* w, const float* g, float* m, float* v, int64_t count, const AdamOptions& opt,
               int64_t step) {
  if (count == 0) return;
  const AdamCoeffs k = adam_coeffs(opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, step);  // on the host
  const int blocks = blocks_for(count);
  const bool decay = opt.weight_decay != 0.0;
  if (opt.decoupled && decay)
    adam_kernel<true, true><<<blocks, kThreads, 0, ctx.stream()>>>(w, g, m, v, count, k);
  else if (opt.decoupled)
    adam_kernel<true, false><<<blocks, kThreads, 0, ctx.stream()>>>(w, g, m, v, count, k);
  else if (decay)
    adam_kernel<false, true><<<blocks, kThreads, 0, ctx.stream()>>>(w, g, m, v, count, k);
  else
    adam_kernel<false, false><<<blocks, kThreads, 0, ctx.stream()>>>(w, g, m, v, count, k);
  DTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace lab::cuda
