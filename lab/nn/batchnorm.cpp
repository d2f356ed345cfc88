// BatchNorm1d / BatchNorm2d and SyncBatchNorm. The arithmetic mirrors PyTorch 1.13's CPU kernels
// (aten/src/ATen/native/Normalization.cpp, cpu/batch_norm_kernel.cpp) closely enough that the
// results agree to a few ulps: per-channel sums accumulate in double, the mean and the variance
// are rounded to float, the output is x * alpha + beta with alpha = invstd * weight and
// beta = bias - mean * alpha. The SyncBN combination follows torch/nn/modules/_functions.py and
// the CUDA batch_norm_gather_stats_with_counts (the only device where PyTorch runs SyncBN).
//
// Sections: errors | run kernels (one (sample, channel) run of H*W values) | whole-tensor loops
// over (N, C, inner) | BatchNorm: construction and names | forward (local stats, SyncBN
// combination, running stats, normalization) | backward (local sums, SyncBN allreduce, dx)
#include "batchnorm.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>

#include "elementwise.h"
#include "errors.h"
#include "mutation.h"
#include "parallel.h"

namespace lab {

namespace {

constexpr const char* kDefaultHint =
    "BatchNorm needs at least two values per channel to compute a batch variance. This usually "
    "means the last, incomplete batch of an epoch holds a single sample (dataset size mod batch "
    "size == 1): set drop_last=True, or choose a batch size that does not leave one sample over.";

std::string torch_size(const std::vector<int64_t>& shape) { return "torch.Size(" + shape_str(shape) + ")"; }

// PyTorch's wording (torch.nn.functional._verify_batch_size), with this layer's own shape.
[[noreturn]] void throw_batch_of_one(const std::vector<int64_t>& shape, const std::string& hint,
                                     const std::string& prefix) {
  throw TrainingError("Expected more than 1 value per channel when training, got input size " + torch_size(shape),
                      prefix + (hint.empty() ? std::string(kDefaultHint) : hint));
}

// The per-element loops below are written for speed at -O2 without -march flags (measured on
// 1.6M values, the cnn's first BatchNorm at batch 64):
//  - forward sums in double, as PyTorch's forward does, over eight named accumulators: a single
//    running sum is one long dependency chain, and an accumulator array is kept in memory;
//  - backward sums, which PyTorch itself does in float, in float lanes over blocks of 64 values
//    folded into double per block (vectorized), still more accurate than PyTorch's;
//  - elementwise loops in blocks of kLanes through __restrict parameters, a shape GCC
//    vectorizes at -O2 (a plain loop stays scalar there).
// Regrouping a sum changes it only far below float32 resolution.
constexpr int kLanes = 8;
constexpr int kBlock = 64;

// sum p[0..n) in double.
inline double sum_of(const float* __restrict p, int64_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
    a4 += p[i + 4];
    a5 += p[i + 5];
    a6 += p[i + 6];
    a7 += p[i + 7];
  }
  for (; i < n; ++i) a0 += p[i];
  return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
}

// sum (p - mean)^2 in double, with the deviation and its square in float (bn_sq_dev), as
// batch_norm_cpu_collect_stats does.
inline double sum_sq_dev(const float* __restrict p, int64_t n, float mean) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a0 += bn_sq_dev(p[i], mean);
    a1 += bn_sq_dev(p[i + 1], mean);
    a2 += bn_sq_dev(p[i + 2], mean);
    a3 += bn_sq_dev(p[i + 3], mean);
    a4 += bn_sq_dev(p[i + 4], mean);
    a5 += bn_sq_dev(p[i + 5], mean);
    a6 += bn_sq_dev(p[i + 6], mean);
    a7 += bn_sq_dev(p[i + 7], mean);
  }
  for (; i < n; ++i) a0 += bn_sq_dev(p[i], mean);
  return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
}

// sum dy and sum dy * (x - mean) over a run, for backward.
inline void accumulate_dy_xmu(const float* __restrict g, const float* __restrict p, int64_t n, float mean,
                              double& sum_dy, double& sum_xmu) {
  double s = 0.0, t = 0.0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float fa[kLanes] = {}, fb[kLanes] = {};
    for (int b = 0; b < kBlock; b += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        fa[j] += g[i + b + j];
        fb[j] += bn_xmu_dy(p[i + b + j], mean, g[i + b + j]);
      }
    }
    double u = 0.0, w = 0.0;
    for (int j = 0; j < kLanes; ++j) {
      u += fa[j];
      w += fb[j];
    }
    s += u;
    t += w;
  }
  for (; i < n; ++i) {
    s += g[i];
    t += bn_xmu_dy(p[i], mean, g[i]);
  }
  sum_dy += s;
  sum_xmu += t;
}

// q = p * alpha + beta (bn_affine); also copies p into saved (when not null) in the same pass, so
// the Train forward reads x once.
inline void scale_shift(const float* __restrict p, float* __restrict q, float* __restrict saved, int64_t n,
                        float alpha, float beta) {
  int64_t i = 0;
  if (saved) {
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) {
        saved[i + j] = p[i + j];
        q[i + j] = bn_affine(p[i + j], alpha, beta);
      }
    for (; i < n; ++i) {
      saved[i] = p[i];
      q[i] = bn_affine(p[i], alpha, beta);
    }
    return;
  }
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) q[i + j] = bn_affine(p[i + j], alpha, beta);
  for (; i < n; ++i) q[i] = bn_affine(p[i], alpha, beta);
}

// dx = (dy - grad_mean - (x - mean) * k) * scale (bn_input_grad)
inline void run_input_grad(const float* __restrict g, const float* __restrict p, float* __restrict q, int64_t n,
                           float grad_mean, float mean, float k, float scale) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) q[i + j] = bn_input_grad(g[i + j], p[i + j], grad_mean, mean, k, scale);
  for (; i < n; ++i) q[i] = bn_input_grad(g[i], p[i], grad_mean, mean, k, scale);
}

// ---- whole-tensor loops over x laid out as (nb, c, inner) ----
// inner > 1 (BatchNorm2d, BatchNorm1d over (N, C, L)): contiguous runs of `inner` values per
// (sample, channel), processed by the run helpers above. inner == 1 (BatchNorm1d over (N, C)):
// a run would be a single value, so those loops go row by row with per-channel arrays instead,
// which vectorizes across channels.

// Every loop runs on the compute threads (parallel.h). The sums split the channels, so that each
// channel is still summed over the samples in order by one thread; the elementwise loops split the
// rows (inner == 1) or the channels.

// out (c,) = per-channel sum of x, in double
void channel_sum(const float* x, int64_t nb, int64_t c, int64_t inner, double* __restrict out) {
  std::fill(out, out + c, 0.0);
  parallel_for(c, [&](int64_t c0, int64_t c1, int) {
    if (inner == 1) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* __restrict row = x + b * c;
        for (int64_t ch = c0; ch < c1; ++ch) out[ch] += row[ch];
      }
      return;
    }
    for (int64_t ch = c0; ch < c1; ++ch)
      for (int64_t b = 0; b < nb; ++b) out[ch] += sum_of(x + (b * c + ch) * inner, inner);
  });
}

// out (c,) = per-channel sum of (x - mean)^2, deviation and square in float, sum in double
void channel_sq_dev(const float* x, int64_t nb, int64_t c, int64_t inner, const float* __restrict mean,
                    double* __restrict out) {
  std::fill(out, out + c, 0.0);
  parallel_for(c, [&](int64_t c0, int64_t c1, int) {
    if (inner == 1) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* __restrict row = x + b * c;
        for (int64_t ch = c0; ch < c1; ++ch) out[ch] += bn_sq_dev(row[ch], mean[ch]);
      }
      return;
    }
    for (int64_t ch = c0; ch < c1; ++ch)
      for (int64_t b = 0; b < nb; ++b) out[ch] += sum_sq_dev(x + (b * c + ch) * inner, inner, mean[ch]);
  });
}


// sum_dy (c,) = per-channel sum of dy; sum_xmu (c,) = per-channel sum of dy * (x - mean)
void channel_grad_sums(const float* dy, const float* x, int64_t nb, int64_t c, int64_t inner,
                       const float* __restrict mean, double* __restrict sum_dy, double* __restrict sum_xmu) {
  std::fill(sum_dy, sum_dy + c, 0.0);
  std::fill(sum_xmu, sum_xmu + c, 0.0);
  parallel_for(c, [&](int64_t c0, int64_t c1, int) {
    if (inner == 1) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* __restrict g = dy + b * c;
        const float* __restrict p = x + b * c;
        for (int64_t ch = c0; ch < c1; ++ch) {
          sum_dy[ch] += g[ch];
          sum_xmu[ch] += bn_xmu_dy(p[ch], mean[ch], g[ch]);
        }
      }
      return;
    }
    for (int64_t ch = c0; ch < c1; ++ch)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t off = (b * c + ch) * inner;
        accumulate_dy_xmu(dy + off, x + off, inner, mean[ch], sum_dy[ch], sum_xmu[ch]);
      }
  });
}

// --nondeterministic (parallel.h: arrival_order): the same sums as partials over blocks of samples
// (a batch of one or two with inner > 1: chunks of each sample's run), each summed in double,
// rounded to float and added in float in an order drawn per call, as GPU thread blocks adding
// their partial sums with atomicAdd do.
void channel_grad_sums_in_drawn_order(const float* dy, const float* x, int64_t nb, int64_t c, int64_t inner,
                                      const float* __restrict mean, double* __restrict sum_dy,
                                      double* __restrict sum_xmu) {
  const ReductionSplit split = split_reduction(nb, inner);
  std::vector<int64_t> order;
  arrival_order(split.count(), order);
  parallel_for(c, [&](int64_t c0, int64_t c1, int) {
    for (int64_t ch = c0; ch < c1; ++ch) {
      float acc_dy = 0.0f, acc_xmu = 0.0f;
      for (const int64_t p : order) {
        int64_t b0, b1, i0, i1;
        split.range(p, b0, b1, i0, i1);
        double s = 0.0, t = 0.0;
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t off = (b * c + ch) * inner;
          accumulate_dy_xmu(dy + off + i0, x + off + i0, i1 - i0, mean[ch], s, t);
        }
        acc_dy += static_cast<float>(s);
        acc_xmu += static_cast<float>(t);
      }
      sum_dy[ch] = acc_dy;
      sum_xmu[ch] = acc_xmu;
    }
  });
}


std::string py_float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);  // matches Python's repr for the usual 1e-05, 0.1
  return buf;
}

}  // namespace

void BnSync::allgather_on(DeviceMemory&, const float*, int, float*) {
  throw Error("this SyncBatchNorm's collectives cannot work on a device's memory");
}

void BnSync::allreduce_sum_on(DeviceMemory&, float*, int) {
  throw Error("this SyncBatchNorm's collectives cannot work on a device's memory");
}

// y = x * alpha[ch] + beta[ch]; saved = x when saved != nullptr
void channel_affine(const float* x, float* y, float* saved, int64_t nb, int64_t c, int64_t inner,
                    const float* __restrict alpha, const float* __restrict beta) {
  if (inner == 1) {
    parallel_for(nb, [&](int64_t b0, int64_t b1, int) {
      for (int64_t b = b0; b < b1; ++b) {
        const float* __restrict in = x + b * c;
        float* __restrict out = y + b * c;
        for (int64_t ch = 0; ch < c; ++ch) out[ch] = bn_affine(in[ch], alpha[ch], beta[ch]);
      }
      if (saved) std::copy(x + b0 * c, x + b1 * c, saved + b0 * c);
    });
    return;
  }
  parallel_for(c, [&](int64_t c0, int64_t c1, int) {
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t ch = c0; ch < c1; ++ch) {
        const int64_t off = (b * c + ch) * inner;
        scale_shift(x + off, y + off, saved ? saved + off : nullptr, inner, alpha[ch], beta[ch]);
      }
  });
}

// dx = (dy - grad_mean[ch] - (x - mean[ch]) * k[ch]) * scale[ch]
void channel_input_grad(const float* dy, const float* x, float* dx, int64_t nb, int64_t c, int64_t inner,
                        const float* __restrict grad_mean, const float* __restrict mean, const float* __restrict k,
                        const float* __restrict scale) {
  if (inner == 1) {
    parallel_for(nb, [&](int64_t b0, int64_t b1, int) {
      for (int64_t b = b0; b < b1; ++b) {
        const float* __restrict g = dy + b * c;
        const float* __restrict p = x + b * c;
        float* __restrict q = dx + b * c;
        for (int64_t ch = 0; ch < c; ++ch) q[ch] = bn_input_grad(g[ch], p[ch], grad_mean[ch], mean[ch], k[ch], scale[ch]);
      }
    });
    return;
  }
  parallel_for(c, [&](int64_t c0, int64_t c1, int) {
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t ch = c0; ch < c1; ++ch) {
        const int64_t off = (b * c + ch) * inner;
        run_input_grad(dy + off, x + off, dx + off, inner, grad_mean[ch], mean[ch], k[ch], scale[ch]);
      }
  });
}

BatchNorm::BatchNorm(const BatchNormOptions& opt) : m_opt(opt) {
  assert(opt.num_features > 0);
  assert(opt.spatial_dims == 0 || opt.spatial_dims == 1 || opt.spatial_dims == 2);
  const int64_t c = opt.num_features;
  m_weight = {"weight", Tensor({c}, 1.0f), Tensor({c})};
  m_bias = {"bias", Tensor({c}, 0.0f), Tensor({c})};
  m_running_mean = {"running_mean", Tensor({c}, 0.0f)};
  m_running_var = {"running_var", Tensor({c}, 1.0f)};
  m_num_batches_tracked = {"num_batches_tracked", Tensor(), true, 0};
}

std::string BatchNorm::kind() const { return m_opt.spatial_dims == 2 ? "BatchNorm2d" : "BatchNorm1d"; }

std::string BatchNorm::describe() const {
  std::string s = kind() + "(" + std::to_string(m_opt.num_features);
  if (m_opt.eps != 1e-5) s += ", eps=" + py_float(m_opt.eps);
  if (!m_opt.momentum) s += ", momentum=None";
  else if (*m_opt.momentum != 0.1) s += ", momentum=" + py_float(*m_opt.momentum);
  if (!m_opt.affine) s += ", affine=False";
  if (!m_opt.track_running_stats) s += ", track_running_stats=False";
  return s + ")";
}

std::vector<Param*> BatchNorm::params() {
  if (!m_opt.affine) return {};
  return {&m_weight, &m_bias};
}

std::vector<Buffer*> BatchNorm::buffers() {
  if (!m_opt.track_running_stats) return {};
  return {&m_running_mean, &m_running_var, &m_num_batches_tracked};
}

// x: (N, C) or (N, C, L) for BatchNorm1d, (N, C, H, W) for BatchNorm2d -> y: like x
void BatchNorm::forward(const Tensor& x, Tensor& y, Mode mode) {
  prepare_forward(x, mode);
  const int64_t nb = x.dim(0), c = m_opt.num_features;
  int64_t inner = 1;
  for (int i = 2; i < x.ndim(); ++i) inner *= x.dim(i);
  // y = x * alpha + beta per channel (an empty batch, n == 0, writes nothing); Train saves x.
  y.resize(x.shape);
  const bool train = mode == Mode::Train;
  if (train) m_x.resize(x.shape);
  channel_affine(x.ptr(), y.ptr(), train ? m_x.ptr() : nullptr, nb, c, inner, m_alpha.data(), m_beta.data());
}

void BatchNorm::check_input(const std::vector<int64_t>& shape) const {
  const int nd = static_cast<int>(shape.size());
  if (m_opt.spatial_dims == 2 && nd != 4)
    throw ConfigError("expected 4D input (got " + std::to_string(nd) + "D input)");
  if (m_opt.spatial_dims != 2 && nd != 2 && nd != 3)
    throw ConfigError("expected 2D or 3D input (got " + std::to_string(nd) + "D input)");
  if (shape[1] != m_opt.num_features)
    throw ConfigError(describe() + " got an input of size " + torch_size(shape) + ": expected " +
                      std::to_string(m_opt.num_features) + " channels");
}

bool BatchNorm::uses_batch_stats(Mode mode) const {
  if (mode == Mode::Train) return true;
  // (lesson mutation tests, mutation.h: eval mode made to use the batch's statistics, or an
  // untracked layer's eval mode made to use the running statistics' initial 0 and 1)
  if (mutated("bn-eval-uses-batch-stats")) return true;
  return !m_opt.track_running_stats && !mutated("bn-untracked-eval-uses-init-stats");
}

void BatchNorm::local_stats(const Tensor& x, std::vector<float>& local_mean, std::vector<float>& local_var_sum) const {
  check_input(x.shape);
  const int64_t c = m_opt.num_features;
  const int64_t nb = x.dim(0);
  int64_t inner = 1;
  for (int i = 2; i < x.ndim(); ++i) inner *= x.dim(i);
  const int64_t n = nb * inner;  // values per channel in this rank's batch
  // The mean rounded to float, then the sum of float squared deviations in double, as
  // batch_norm_cpu_collect_stats does.
  local_mean.assign(static_cast<size_t>(c), 0.0f);
  local_var_sum.assign(static_cast<size_t>(c), 0.0f);
  if (n == 0) return;
  std::vector<double> acc(static_cast<size_t>(c));
  channel_sum(x.ptr(), nb, c, inner, acc.data());
  for (int64_t ch = 0; ch < c; ++ch) local_mean[ch] = bn_mean(acc[ch], n);
  channel_sq_dev(x.ptr(), nb, c, inner, local_mean.data(), acc.data());
  for (int64_t ch = 0; ch < c; ++ch) local_var_sum[ch] = static_cast<float>(acc[ch]);
}

void BatchNorm::prepare_forward(const Tensor& x, Mode mode) {
  check_input(x.shape);
  std::vector<float> local_mean, local_var_sum;
  if (uses_batch_stats(mode)) local_stats(x, local_mean, local_var_sum);
  prepare_from_local_stats(x.shape, mode, std::move(local_mean), std::move(local_var_sum));
}

BatchNorm::ForwardPlan BatchNorm::begin_forward(const std::vector<int64_t>& shape, Mode mode) {
  check_input(shape);
  ForwardPlan p;
  const int64_t nb = shape[0];
  int64_t inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
  p.n = nb * inner;  // values per channel in this rank's batch
  const bool train = mode == Mode::Train;
  p.batch_stats = uses_batch_stats(mode);
  // Eval never communicates, even when it normalizes with batch statistics (no running stats).
  // (a lesson's mutation test, mutation.h: SyncBatchNorm made ordinary BatchNorm)
  p.sync = train && m_sync != nullptr && m_sync->world_size() > 1 && !mutated("syncbn-local-stats");
  // _BatchNorm.forward counts the batch before F.batch_norm checks its size, so a batch-of-one
  // error leaves num_batches_tracked one higher: kept, because PyTorch does it.
  p.update = train && m_opt.track_running_stats;
  if (p.update) {
    ++m_num_batches_tracked.i64;
    p.factor = m_opt.momentum ? *m_opt.momentum : 1.0 / static_cast<double>(m_num_batches_tracked.i64);
  }
  // (lesson mutation tests, mutation.h: the size check left out, or made a check of N alone)
  if (p.batch_stats && !p.sync &&
      ((p.n == 1 && !mutated("bn-allow-one-value")) || (nb == 1 && mutated("bn-refuses-batch-of-one"))))
    throw_batch_of_one(shape, m_hint, "");
  return p;
}

void BatchNorm::check_global_count(const std::vector<int64_t>& shape, int64_t count) const {
  if (count != 1) return;
  std::vector<int64_t> global_shape = shape;
  global_shape[0] = 1;
  throw_batch_of_one(global_shape, m_hint,
                     "SyncBatchNorm: the global batch over " + std::to_string(m_sync ? m_sync->world_size() : 1) +
                         " ranks holds one value per channel. ");
}

void BatchNorm::prepare_from_local_stats(const std::vector<int64_t>& shape, Mode mode, std::vector<float> local_mean,
                                         std::vector<float> local_var_sum) {
  check_input(shape);
  const int64_t c = m_opt.num_features;
  const bool train = mode == Mode::Train;
  if (uses_batch_stats(mode) &&
      (local_mean.size() != static_cast<size_t>(c) || local_var_sum.size() != static_cast<size_t>(c)))
    throw Error(describe() + ": local statistics of " + std::to_string(local_mean.size()) + " and " +
                std::to_string(local_var_sum.size()) + " channels, expected " + std::to_string(c));
  const ForwardPlan plan = begin_forward(shape, mode);
  const int64_t n = plan.n;
  const bool batch_stats = plan.batch_stats, sync = plan.sync, update = plan.update;
  const double factor = plan.factor;

  m_mean.assign(static_cast<size_t>(c), 0.0f);
  m_invstd.assign(static_cast<size_t>(c), 0.0f);
  int64_t count = n;

  if (batch_stats) {
  std::vector<float> local_var(static_cast<size_t>(c), 0.0f);
    for (int64_t ch = 0; ch < c && n > 0; ++ch) local_var[ch] = bn_biased_var(local_var_sum[ch], n);

    std::vector<float> var(static_cast<size_t>(c), 0.0f);
    if (!sync) {
      m_mean = local_mean;
      var = local_var;
      if (update && n > 0) {
        // batch_norm_cpu_update_stats_template: float momentum; the unbiased variance is
        // var_sum / (n - 1) in float, then mixed in double.
        const float m = static_cast<float>(factor);
        float* rm = m_running_mean.value.ptr();
        float* rv = m_running_var.value.ptr();
        for (int64_t ch = 0; ch < c; ++ch) bn_running_update(rm[ch], rv[ch], local_mean[ch], local_var_sum[ch], n, m);
      }
    } else {
      // Every rank contributes (mean, biased var, count), an empty rank zeros with count 0, and
      // every rank combines the gathered rows in rank order: the same result everywhere.
      const int world = m_sync->world_size();
      const int row = static_cast<int>(2 * c + 1);
      std::vector<float> mine(static_cast<size_t>(row), 0.0f);
      if (n > 0) {
        for (int64_t ch = 0; ch < c; ++ch) {
          mine[ch] = local_mean[ch];
          mine[c + ch] = local_var[ch];
        }
        mine[2 * c] = static_cast<float>(n);  // exact below 2^24 values per channel
      }
      std::vector<float> all;
      m_sync->allgather(mine.data(), row, all);
      assert(static_cast<int>(all.size()) == world * row);
      double total = 0.0;
      for (int r = 0; r < world; ++r) total += all[static_cast<size_t>(r) * row + 2 * c];
      count = static_cast<int64_t>(total);
      check_global_count(shape, count);
      for (int64_t ch = 0; ch < c; ++ch) {
        // Chan et al.'s pairwise update (an empty rank's zeros take no part)
        const BnGlobalStats g = bn_combine_channel(all.data(), world, c, ch);
        if (g.cnt < 1.0) continue;
        m_mean[ch] = static_cast<float>(g.avg);
        var[ch] = static_cast<float>(g.m2 / g.cnt);
        if (update)
          bn_running_update_global(m_running_mean.value.ptr()[ch], m_running_var.value.ptr()[ch], g.avg, g.m2, g.cnt,
                                   factor);
      }
    }
    for (int64_t ch = 0; ch < c; ++ch) m_invstd[ch] = bn_invstd(var[ch], m_opt.eps);
    if (train) {
      m_stats.mean = m_mean;
      m_stats.var = var;
      m_stats.local_mean = std::move(local_mean);
      m_stats.local_var = std::move(local_var);
      m_stats.count = count;
      m_stats.local_count = n;
    }
  } else {
    // Eval with running statistics (batch_norm_cpu_collect_linear_and_constant_terms).
    const float eps = static_cast<float>(m_opt.eps);
    for (int64_t ch = 0; ch < c; ++ch) {
      m_mean[ch] = m_running_mean.value.ptr()[ch];
      m_invstd[ch] = bn_invstd_running(m_running_var.value.ptr()[ch], eps);
    }
  }

  // y = x * alpha + beta per channel
  m_alpha.resize(static_cast<size_t>(c));
  m_beta.resize(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    const float w = m_opt.affine ? m_weight.value.ptr()[ch] : 1.0f;
    const float b = m_opt.affine ? m_bias.value.ptr()[ch] : 0.0f;
    m_alpha[ch] = bn_alpha(m_invstd[ch], w);
    m_beta[ch] = bn_beta(b, m_mean[ch], m_alpha[ch]);
  }

  if (train) {
    m_shape = shape;
    m_count = count;
    m_synced = sync;
  }
}

// dy: like x -> dx: like x
void BatchNorm::backward(const Tensor& dy, Tensor* dx) {
  assert(dy.shape == m_shape);
  const int64_t c = m_opt.num_features;
  const int64_t nb = m_shape[0];
  int64_t inner = 1;
  for (size_t i = 2; i < m_shape.size(); ++i) inner *= m_shape[i];

  // Local per-channel sums: sum_dy and sum_dy_xmu = sum dy * (x - mean).
  std::vector<double> sum_dy, sum_dy_xmu;
  grad_sums(dy, m_x, sum_dy, sum_dy_xmu);
  const InputGradCoefficients* k = finish_backward(sum_dy, sum_dy_xmu, dx != nullptr);
  if (!dx) return;
  dx->resize(m_shape);
  channel_input_grad(dy.ptr(), m_x.ptr(), dx->ptr(), nb, c, inner, k->grad_mean.data(), m_mean.data(), k->k.data(),
                     k->scale.data());
}

void BatchNorm::grad_sums(const Tensor& dy, const Tensor& x, std::vector<double>& sum_dy,
                          std::vector<double>& sum_dy_xmu) const {
  assert(dy.shape == x.shape && x.ndim() >= 2 && x.dim(1) == m_opt.num_features);
  const int64_t c = m_opt.num_features;
  int64_t inner = 1;
  for (int i = 2; i < x.ndim(); ++i) inner *= x.dim(i);
  sum_dy.assign(static_cast<size_t>(c), 0.0);
  sum_dy_xmu.assign(static_cast<size_t>(c), 0.0);
  if (nondeterministic())
    channel_grad_sums_in_drawn_order(dy.ptr(), x.ptr(), x.dim(0), c, inner, m_mean.data(), sum_dy.data(),
                                     sum_dy_xmu.data());
  else
    channel_grad_sums(dy.ptr(), x.ptr(), x.dim(0), c, inner, m_mean.data(), sum_dy.data(), sum_dy_xmu.data());
}

const BatchNorm::InputGradCoefficients* BatchNorm::finish_backward(const std::vector<double>& sum_dy,
                                                                   const std::vector<double>& sum_dy_xmu,
                                                                   bool want_dx) {
  const int64_t c = m_opt.num_features;
  // weight/bias gradients stay local (DDP averages them like any other gradient).
  if (m_opt.affine) {
    for (int64_t ch = 0; ch < c; ++ch) {
      m_weight.grad.ptr()[ch] += bn_weight_grad(sum_dy_xmu[ch], m_invstd[ch]);
      m_bias.grad.ptr()[ch] += bn_bias_grad(sum_dy[ch]);
    }
  }

  // SyncBN: one allreduce of [sum_dy (C) | sum_dy_xmu (C)]. Done even when this rank needs no dx
  // (PyTorch skips it then) so that every rank issues the same collectives.
  std::vector<float> global(static_cast<size_t>(2 * c));
  for (int64_t ch = 0; ch < c; ++ch) {
    global[ch] = static_cast<float>(sum_dy[ch]);
    global[c + ch] = static_cast<float>(sum_dy_xmu[ch]);
  }
  if (m_synced) m_sync->allreduce_sum(global.data(), static_cast<int>(2 * c));

  if (!want_dx) return nullptr;
  const double count = static_cast<double>(m_count);
  InputGradCoefficients& out = m_coef;
  out.k.resize(static_cast<size_t>(c));
  out.grad_mean.resize(static_cast<size_t>(c));
  out.scale.resize(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    const float w = m_opt.affine ? m_weight.value.ptr()[ch] : 1.0f;
    // dx = (dy - sum_dy/N - (x - mean) * invstd^2 * sum_dy_xmu/N) * invstd * weight
    const BnInputGradCoefficients k = bn_input_grad_coefficients(global[ch], global[c + ch], m_invstd[ch], w, count);
    out.k[ch] = k.k;
    out.grad_mean[ch] = k.grad_mean;
    out.scale[ch] = k.scale;
  }
  return &out;
}

}  // namespace lab
