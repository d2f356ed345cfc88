// The hand-written GPU ops the two models need besides the products (cuda_gemm.h) and the
// convolutions (cuda_conv.h): bias, ReLU, 2x2 max-pool, BatchNorm, the loss and SGD. Every pointer
// is device memory; every op queues its kernels on the context's stream and returns.
//
// Same numbers as the CPU layers: the per-element arithmetic is lab/tensor/elementwise.h's, compiled
// for the device without FMA contraction (--fmad=false), so elementwise results are bitwise the
// CPU's. Deterministic: no float atomics anywhere. A reduction (per-channel sums, the loss) runs in
// one block of kReduceThreads threads per output; thread t adds the values t, t + kReduceThreads,
// ... in order, in double, and the block adds the threads' sums in a fixed binary tree. Two runs
// give the same bits; against the CPU, which adds in another order, sums agree to double rounding
// before they are rounded to float.
//
// Sections: bias | ReLU | max-pool | BatchNorm | cross-entropy | SGD | Adam
#pragma once

#include <cstdint>
#include <vector>

#include "cuda_context.h"
#include "optim.h"

namespace lab::cuda {

constexpr int kReduceThreads = 256;

// ---- bias (Linear: inner = 1; Conv2d: inner = Ho * Wo) ----
// y: (N, C, inner) += b (C,) per channel
void bias_add(CudaContext& ctx, float* y, const float* b, int64_t n, int64_t c, int64_t inner);
// db (C,) += float(sum of dy over N and inner, in double); dy: (N, C, inner)
void bias_grad(CudaContext& ctx, const float* dy, float* db, int64_t n, int64_t c, int64_t inner);

// ---- ReLU ----
// x: (count,) -> y = relu_value(x), mask = relu_passes(x) (1 byte each)
void relu_forward(CudaContext& ctx, const float* x, float* y, uint8_t* mask, int64_t count);
// dy, mask: (count,) -> dx = relu_grad(dy, mask)
void relu_backward(CudaContext& ctx, const float* dy, const uint8_t* mask, float* dx, int64_t count);

// ---- max-pool 2x2 (MaxPool2d(2): stride 2, floor mode) ----
// x: (planes, H, W) -> y: (planes, H/2, W/2); argmax: (planes, H/2, W/2) the winner's index within
// its input plane (H * W), as MaxPool2d keeps it; the winner is pool2x2_place's.
void maxpool2x2_forward(CudaContext& ctx, const float* x, float* y, int32_t* argmax, int64_t planes, int h, int w);
// dy: (planes, H/2, W/2) -> dx: (planes, H, W) = 0 + dy at each window's winner, 0 elsewhere
void maxpool2x2_backward(CudaContext& ctx, const float* dy, const int32_t* argmax, float* dx, int64_t planes, int h,
                         int w);

// ---- BatchNorm over x: (N, C, inner) (BatchNorm1d: inner 1, BatchNorm2d: inner H * W) ----
// Batch statistics per channel over n = N * inner values: mean = bn_mean(sum), var_sum = the sum of
// bn_sq_dev in double rounded to float, var = bn_biased_var(var_sum, n). mean, var_sum, var: (C,).
// n == 0 gives zeros (the CPU layer's empty batch); n == 1 is the caller's batch-of-one error.
void bn_batch_stats(CudaContext& ctx, const float* x, int64_t n, int64_t c, int64_t inner, float* mean,
                    float* var_sum, float* var);
// Running statistics after a local batch of count > 1 values per channel, momentum m (the factor:
// momentum, or 1 / num_batches_tracked for the cumulative average). All (C,).
void bn_running_update(CudaContext& ctx, const float* mean, const float* var_sum, int64_t count, float m,
                       float* running_mean, float* running_var, int64_t c);
// invstd = bn_invstd(var, eps), alpha, beta (C,) of y = x * alpha + beta; weight/bias null: no affine.
void bn_forward_coefficients(CudaContext& ctx, const float* mean, const float* var, const float* weight,
                             const float* bias, double eps, int64_t c, float* invstd, float* alpha, float* beta);
// Eval with running statistics: mean = running_mean, invstd = bn_invstd_running(running_var, eps),
// alpha, beta (C,); weight/bias null: no affine.
void bn_eval_coefficients(CudaContext& ctx, const float* running_mean, const float* running_var, const float* weight,
                          const float* bias, float eps, int64_t c, float* mean, float* invstd, float* alpha,
                          float* beta);
// SyncBatchNorm's row of this rank, row (2C + 1,) = [mean | biased var | count] (all zeros for an
// empty batch, count 0), as the CPU layer gathers it.
void bn_pack_row(CudaContext& ctx, const float* mean, const float* var, int64_t count, int64_t c, float* row);
// From the gathered rows all (world, 2C + 1): the global mean and biased variance (C,) by
// bn_combine_channel, and, when update, the running statistics by bn_running_update_global with
// factor. Channels of an all-empty world: zeros, running statistics untouched.
void bn_combine_stats(CudaContext& ctx, const float* all, int world, int64_t c, bool update, double factor,
                      float* running_mean, float* running_var, float* mean, float* var);
// out (2C,) = [float(sum_dy) | float(sum_dy_xmu)]: SyncBN's backward allreduce buffer.
void bn_sums_to_float(CudaContext& ctx, const double* sum_dy, const double* sum_dy_xmu, int64_t c, float* out);
// y = bn_affine(x, alpha[ch], beta[ch])
void bn_apply(CudaContext& ctx, const float* x, const float* alpha, const float* beta, float* y, int64_t n, int64_t c,
              int64_t inner);
// sum_dy, sum_dy_xmu (C,) in double: sum of dy and of bn_xmu_dy(x, mean, dy) per channel
void bn_grad_sums(CudaContext& ctx, const float* dy, const float* x, const float* mean, int64_t n, int64_t c,
                  int64_t inner, double* sum_dy, double* sum_dy_xmu);
// From this rank's sums: dweight, dbias (C,) += bn_weight_grad / bn_bias_grad (null: no affine,
// skipped); and from the global float sums, global (2C,) = [sum_dy | sum_dy_xmu] as SyncBN's
// allreduce left them (null: local BatchNorm, this rank's sums rounded to float), the
// input-gradient coefficients grad_mean, k, scale (C,) over count values. weight null: 1.
void bn_backward_coefficients(CudaContext& ctx, const double* sum_dy, const double* sum_dy_xmu, const float* global,
                              const float* invstd, const float* weight, int64_t count, int64_t c, float* dweight,
                              float* dbias, float* grad_mean, float* k, float* scale);
// dx = bn_input_grad(dy, x, grad_mean[ch], mean[ch], k[ch], scale[ch])
void bn_input_grad(CudaContext& ctx, const float* dy, const float* x, const float* mean, const float* grad_mean,
                   const float* k, const float* scale, float* dx, int64_t n, int64_t c, int64_t inner);

// ---- cross-entropy (nn.CrossEntropyLoss, mean reduction) ----
// logits: (N, C), labels: (N,) in [0, C) -> loss (1,) = the mean loss, correct (1,) = argmax hits,
// dlogits (N, C) = (softmax - onehot) / N (null: none). One block: rows t, t + kReduceThreads, ...
void cross_entropy(CudaContext& ctx, const float* logits, const int32_t* labels, int64_t n, int64_t c, float* loss,
                   int32_t* correct, float* dlogits);

// acc (count,) += in (count,), elementwise in float32: the ring's reduction on device buffers
// (CudaDeviceMemory::add), the same bits as the CPU's add.
void add_into(CudaContext& ctx, float* acc, const float* in, int64_t count);
// x (count,) *= k, float32 (DDP's 1/world_size as a gradient enters its bucket).
void scale_inplace(CudaContext& ctx, float* x, float k, int64_t count);
// x (count,) /= d, float32 (a communication hook's tensor.div_).
void divide_inplace(CudaContext& ctx, float* x, float d, int64_t count);
// *bad (device) = whether any of x (count,) is NaN or infinite: zeroed, then set by an integer
// atomic (no float atomics: the answer does not depend on the order).
void count_nonfinite(CudaContext& ctx, const float* x, int64_t count, int32_t* bad);
// *any (device) = whether any of flags (count,) is nonzero: the "skip" of a captured step's
// optimizer kernels (--cuda-graphs), which cannot ask the host.
void any_flag(CudaContext& ctx, const int32_t* flags, int64_t count, int32_t* any);

// ---- SGD (torch.optim.SGD) over one flat buffer of count values ----
// w, g, buf: (count,) parameters, gradients, momentum buffers (buf unused without momentum).
// first: the first step (buf = d, no dampening).
void sgd_step(CudaContext& ctx, float* w, const float* g, float* buf, int64_t count, const SgdOptions& opt, bool first);

// ---- several tensors in one kernel (a captured step's: PyTorch's foreach kernels) ----
// flags (device, xs.size()) [i] = whether xs[i] (counts[i] values) holds a NaN or an infinity:
// zeroed, then set by integer atomics, kMaxTensors tensors per kernel.
void nonfinite_flags(CudaContext& ctx, const std::vector<const float*>& xs, const std::vector<int64_t>& counts,
                     int32_t* flags);
// sgd_step of every tensor i (w[i], g[i], buf[i], counts[i] values), the same element function,
// so the same bits, kMaxTensors tensors per kernel. buf: empty without momentum. skip (device, may
// be null): when *skip is nonzero nothing changes (a captured step whose gradients are not all
// finite, which cannot ask the host).
void sgd_step_multi(CudaContext& ctx, const std::vector<float*>& w, const std::vector<const float*>& g,
                    const std::vector<float*>& buf, const std::vector<int64_t>& counts, const SgdOptions& opt, bool first,
                    const int32_t* skip = nullptr);

// ---- Adam and AdamW (torch.optim.Adam / AdamW) over one flat buffer ----
// w, g, m, v: (count,) parameters, gradients, exp_avg, exp_avg_sq; step: 1 for the first. The
// coefficients (bias corrections in double) are computed on the host, as adam_apply's.
void adam_step(CudaContext& ctx, float* w, const float* g, float* m, float* v, int64_t count, const AdamOptions& opt,
               int64_t step);

}  // namespace lab::cuda
