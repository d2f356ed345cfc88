// Per-element and per-channel arithmetic that the CPU layers (lab/nn) and the GPU kernels
// (backends/cuda) share, so that both compute every value with the same operations in the same
// order and the CPU tests exercise the GPU's formulas. Plain C++: DTLAB_HD marks a function
// __host__ __device__ when nvcc compiles it and is empty otherwise; no CUDA header is included.
//
// Rounding contract: every expression here is written with the float/double types of the CPU
// reference it came from (the comments name it), and neither side contracts a * b + c into one
// fused multiply-add: the CPU layers build with -ffp-contract=off, the CUDA sources with
// --fmad=false. Under that contract an elementwise result is bitwise the same on both devices;
// exp and log (the loss) may differ in the last bit of a double, far below float resolution.
//
// Sections: ReLU | max-pool | BatchNorm (statistics, running statistics, affine map, backward) |
// SGD | Adam and AdamW | cross-entropy
#pragma once

#include <math.h>  // sqrt, sqrtf, exp, log: the names that are host and device functions alike

#include <cstdint>

#if defined(__CUDACC__)
#define DTLAB_HD __host__ __device__
#else
#define DTLAB_HD
#endif

namespace lab {

// ---- ReLU (relu.cpp) ----

// torch.relu: v < 0 ? 0 : v, which lets NaN (and -0) through.
DTLAB_HD inline float relu_value(float v) { return v < 0.0f ? 0.0f : v; }
// Whether the gradient at v passes (threshold_backward on the result: y > 0, or NaN).
DTLAB_HD inline bool relu_passes(float v) { return !(v <= 0.0f); }
// The gradient through ReLU: g where it passes, else 0.
DTLAB_HD inline float relu_grad(float g, bool passes) { return passes ? g : 0.0f; }

// ---- max-pool (maxpool2d.cpp, bn_relu_pool.cpp) ----

// PyTorch's CPU max-pool scans a window from -inf and takes a value when it is strictly greater
// than the best so far (the first of equal maxima stays) or NaN (the last NaN wins).
DTLAB_HD inline bool pool_takes(float v, float best) { return (v > best) | (v != v); }

// The winner of a 2x2 window  a b / c d  under pool_takes: 0 a, 1 b, 2 c, 3 d. A tournament:
// (a, b) and (c, d), then the bottom pair's winner replaces the top's only if it takes over it,
// which is the sequential scan's answer.
DTLAB_HD inline int pool2x2_place(float a, float b, float c, float d) {
  const bool right_top = pool_takes(b, a), right_bottom = pool_takes(d, c);
  const float top = right_top ? b : a, bottom = right_bottom ? d : c;
  return pool_takes(bottom, top) ? 2 + static_cast<int>(right_bottom) : static_cast<int>(right_top);
}

// ---- BatchNorm (batchnorm.cpp) ----
// Statistics per channel over n values: the sum in double, the mean rounded to float, then the sum
// of squared float deviations (x - mean)^2 in double, rounded to float (var_sum), as PyTorch's
// batch_norm_cpu_collect_stats does.

// The batch mean from the double sum of n > 0 values.
DTLAB_HD inline float bn_mean(double sum, int64_t n) { return static_cast<float>(sum / static_cast<double>(n)); }
// One term of the squared-deviation sum: deviation and square in float.
DTLAB_HD inline float bn_sq_dev(float x, float mean) {
  const float d = x - mean;
  return d * d;
}
// The biased variance from the rounded squared-deviation sum of n > 0 values.
DTLAB_HD inline float bn_biased_var(float var_sum, int64_t n) { return var_sum / static_cast<float>(n); }

// Running statistics after a local batch (batch_norm_cpu_update_stats_template): momentum m in
// float, the unbiased variance var_sum / (n - 1) in float, mixed into the running variance in
// double. n > 1.
DTLAB_HD inline void bn_running_update(float& running_mean, float& running_var, float mean, float var_sum, int64_t n,
                                       float m) {
  running_mean = m * mean + (1.0f - m) * running_mean;
  const double unbiased = var_sum / static_cast<float>(n - 1);
  running_var = static_cast<float>(m * unbiased + (1.0f - m) * running_var);
}
// Running statistics after SyncBatchNorm's global batch (mean avg, squared deviations m2 over cnt
// values, all in double; batch_norm_gather_stats_with_counts).
DTLAB_HD inline void bn_running_update_global(float& running_mean, float& running_var, double avg, double m2,
                                              double cnt, double factor) {
  running_mean = static_cast<float>((1.0 - factor) * running_mean + factor * avg);
  running_var = static_cast<float>((1.0 - factor) * running_var + factor * (m2 / (cnt - 1.0)));
}

// SyncBatchNorm's statistics of channel ch from every rank's row of the gathered table `all`
// (world rows of 2c + 1 floats: [mean (c) | biased var (c) | count]): Chan et al.'s pairwise
// update in rank order, as batch_norm_reduce_statistics_kernel does it. A rank with count < 1 (an
// empty batch's zeros) takes no part. Returns cnt, the global count (0: every rank was empty).
struct BnGlobalStats {
  double avg, m2, cnt;
};
DTLAB_HD inline BnGlobalStats bn_combine_channel(const float* all, int world, int64_t c, int64_t ch) {
  const int64_t row = 2 * c + 1;
  double cnt = 0.0, avg = 0.0, m2 = 0.0;
  for (int r = 0; r < world; ++r) {
    const float* rowp = all + r * row;
    const double cr = rowp[2 * c];
    if (cr < 1.0) continue;
    const double mr = rowp[ch], vr = rowp[c + ch];
    const double f = 1.0 / (cnt + cr);
    m2 += vr * cr + (avg - mr) * (avg - mr) * cnt * cr * f;
    avg = cnt * f * avg + cr * f * mr;
    cnt += cr;
  }
  return BnGlobalStats{avg, m2, cnt};
}

// 1 / sqrt(var + eps) for batch statistics, in double, rounded to float.
DTLAB_HD inline float bn_invstd(float var, double eps) {
  return static_cast<float>(1.0 / sqrt(static_cast<double>(var) + eps));
}
// 1 / sqrt(running_var + eps) in float, for eval with running statistics
// (batch_norm_cpu_collect_linear_and_constant_terms).
DTLAB_HD inline float bn_invstd_running(float running_var, float eps) { return 1.0f / sqrtf(running_var + eps); }

// y = x * alpha + beta per channel, with alpha = invstd * weight and beta = bias - mean * alpha
// (weight 1 and bias 0 without affine).
DTLAB_HD inline float bn_alpha(float invstd, float weight) { return invstd * weight; }
DTLAB_HD inline float bn_beta(float bias, float mean, float alpha) { return bias - mean * alpha; }
DTLAB_HD inline float bn_affine(float x, float alpha, float beta) { return x * alpha + beta; }

// Backward, from the per-channel sums sum_dy = sum dy and sum_dy_xmu = sum dy * (x - mean) (the
// product in float, the sums in double): the parameter gradients use this rank's own sums; the
// input gradient uses the (SyncBN: allreduced) float sums over count values:
//   dx = (dy - grad_mean - (x - mean) * k) * scale
DTLAB_HD inline float bn_xmu_dy(float x, float mean, float dy) { return (x - mean) * dy; }
DTLAB_HD inline float bn_weight_grad(double sum_dy_xmu, float invstd) {
  return static_cast<float>(sum_dy_xmu * invstd);
}
DTLAB_HD inline float bn_bias_grad(double sum_dy) { return static_cast<float>(sum_dy); }
struct BnInputGradCoefficients {
  float grad_mean, k, scale;
};
DTLAB_HD inline BnInputGradCoefficients bn_input_grad_coefficients(float sum_dy, float sum_dy_xmu, float invstd_f,
                                                                   float weight, double count) {
  const double invstd = invstd_f;
  BnInputGradCoefficients c;
  c.k = static_cast<float>(sum_dy_xmu * invstd * invstd / count);
  c.grad_mean = static_cast<float>(sum_dy / count);
  c.scale = static_cast<float>(invstd * weight);
  return c;
}
DTLAB_HD inline float bn_input_grad(float dy, float x, float grad_mean, float mean, float k, float scale) {
  return (dy - grad_mean - (x - mean) * k) * scale;
}

// ---- SGD (optim.cpp) ----
// torch.optim.SGD on one element; every `add(x, alpha=a)` is x * float(a) added in float.
struct SgdCoeffs {
  float wd, momentum, keep, neg_lr;  // keep = 1 - dampening
};

// The coefficients torch.optim.SGD's options give, each rounded to float once per step.
DTLAB_HD inline SgdCoeffs sgd_coeffs(double lr, double momentum, double dampening, double weight_decay) {
  return SgdCoeffs{static_cast<float>(weight_decay), static_cast<float>(momentum),
                   1.0f - static_cast<float>(dampening), -static_cast<float>(lr)};
}

// w: the parameter, g: its gradient, buf: its momentum buffer. kFirst: the first step, where
// buf = clone(d) with no dampening, as PyTorch does. kDecay false skips the weight decay add
// entirely (so an inf weight stays inf), as PyTorch does for weight_decay == 0.
template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
DTLAB_HD inline void sgd_element(float& w, float g, float& buf, const SgdCoeffs& k) {
  float d = g;
  if constexpr (kDecay) d = d + k.wd * w;
  if constexpr (kMomentum) {
    const float b = kFirst ? d : buf * k.momentum + k.keep * d;
    buf = b;
    d = kNesterov ? d + k.momentum * b : b;
  }
  w = w + k.neg_lr * d;
}

// ---- Adam and AdamW (optim.cpp) ----
// torch.optim.Adam / AdamW (PyTorch 1.13's single-tensor path) on one element, at step t (1, 2, ...):
//   Adam:  g = g + wd * w                       (grad.add(param, alpha=weight_decay), wd != 0)
//   AdamW: w = w * (1 - lr * wd)                (param.mul_(1 - lr * weight_decay))
//   m = m * beta1 + (1 - beta1) * g             (exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1))
//   v = v * beta2 + (1 - beta2) * g * g         (exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2))
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps   ((exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps))
//   w = w + (-lr / (1 - beta1^t)) * m / denom   (param.addcdiv_(exp_avg, denom, value=-step_size))
// The bias corrections and the step size in double, as Python computes them, each coefficient
// rounded to float once per step. PyTorch's vectorized kernels fuse some of the multiply-adds
// (fma); these round each operation, so the two agree to an ulp or two per step.
struct AdamCoeffs {
  float beta1, keep1, beta2, keep2;  // keep = 1 - beta
  float bc2_sqrt, eps, neg_step_size;
  float wd, decay;  // Adam's L2 coefficient; AdamW's factor 1 - lr * wd
};

DTLAB_HD inline AdamCoeffs adam_coeffs(double lr, double beta1, double beta2, double eps, double weight_decay,
                                       int64_t step) {
  const double bc1 = 1.0 - pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - pow(beta2, static_cast<double>(step));
  AdamCoeffs k;
  k.beta1 = static_cast<float>(beta1);
  k.keep1 = static_cast<float>(1.0 - beta1);
  k.beta2 = static_cast<float>(beta2);
  k.keep2 = static_cast<float>(1.0 - beta2);
  k.bc2_sqrt = static_cast<float>(sqrt(bc2));
  k.eps = static_cast<float>(eps);
  k.neg_step_size = static_cast<float>(-(lr / bc1));
  k.wd = static_cast<float>(weight_decay);
  k.decay = static_cast<float>(1.0 - lr * weight_decay);
  return k;
}

// w: the parameter, g: its gradient, m and v: its exp_avg and exp_avg_sq. kDecoupled: AdamW.
// kDecay false: weight_decay == 0, where Adam adds nothing (an inf weight stays out of the
// gradient) and AdamW multiplies by 1.
template <bool kDecoupled, bool kDecay>
DTLAB_HD inline void adam_element(float& w, float g, float& m, float& v, const AdamCoeffs& k) {
  if constexpr (kDecoupled) {
    if constexpr (kDecay) w = w * k.decay;
  } else if constexpr (kDecay) {
    g = g + k.wd * w;
  }
  m = m * k.beta1 + k.keep1 * g;
  v = v * k.beta2 + k.keep2 * g * g;
  const float denom = sqrtf(v) / k.bc2_sqrt + k.eps;
  w = w + k.neg_step_size * m / denom;
}

// ---- cross-entropy (optim.cpp) ----

// One row of nn.CrossEntropyLoss (mean over n rows): z (c,) logits, label in [0, c). Returns the
// row's loss, log(sum exp(z - max)) - (z[label] - max), in double; *best = argmax with
// torch.argmax's rules (the first of equal maxima; a NaN counts as the maximum). When d is not
// null, d (c,) = (softmax(z) - onehot(label)) / n.
DTLAB_HD inline double cross_entropy_row(const float* z, int64_t c, int64_t label, int64_t n, float* d,
                                         int64_t* best) {
  int64_t arg = 0;
  for (int64_t j = 1; j < c; ++j)
    if (!(z[arg] != z[arg]) && (z[j] > z[arg] || z[j] != z[j])) arg = j;
  *best = arg;
  const float zmax = z[arg];
  double sum = 0.0;
  for (int64_t j = 0; j < c; ++j) sum += exp(static_cast<double>(z[j] - zmax));
  const double lse = log(sum);
  if (d) {
    for (int64_t j = 0; j < c; ++j) {
      const double p = exp(static_cast<double>(z[j] - zmax) - lse);
      d[j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / static_cast<double>(n));
    }
  }
  return lse - (z[label] - zmax);
}

}  // namespace lab
