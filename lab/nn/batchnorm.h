// BatchNorm1d / BatchNorm2d, exactly as PyTorch (docs/semantics.md), local or synchronized.
//   x: (N, C) or (N, C, H, W); statistics per channel over n = N*H*W values.
// Train: normalize with the batch mean and the biased variance; update running stats with the
// unbiased variance; momentum is the weight of the new batch (None: cumulative average 1/k).
// Eval: normalize with running stats; no buffer changes. track_running_stats=false: no buffers,
// batch statistics in both modes.
// SyncBatchNorm: when a BnSync is attached (and the world has more than one rank), the batch
// statistics are the count-weighted statistics of the global batch and backward sums
// (sum_dy, sum_dy_xmu) across ranks.
#pragma once

#include <optional>

#include "module.h"

namespace lab {

class DeviceMemory;

// What SyncBatchNorm needs from the communicator. Implemented by the run on top of collectives.
// Every rank calls these in the same order, with the same n.
class BnSync {
 public:
  virtual ~BnSync() = default;
  virtual int world_size() const = 0;
  // Gathers n floats from every rank: all = concat over ranks in rank order, size world*n.
  virtual void allgather(const float* mine, int n, std::vector<float>& all) = 0;
  // In-place elementwise sum over ranks of n floats.
  virtual void allreduce_sum(float* data, int n) = 0;
  // The same two on buffers in a device's memory (lab/comm/device_memory.h): a BatchNorm that runs
  // whole on a device (executor.h) gathers and reduces there. all: world*n floats of mem. The
  // defaults throw Error: a BnSync that cannot say so (a test's) is never given a device.
  virtual void allgather_on(DeviceMemory& mem, const float* mine, int n, float* all);
  virtual void allreduce_sum_on(DeviceMemory& mem, float* data, int n);
};

struct BatchNormOptions {
  int num_features = 0;
  int spatial_dims = 0;                // 0 for BatchNorm1d over (N, C), 2 for BatchNorm2d
  double eps = 1e-5;
  std::optional<double> momentum = 0.1; // nullopt: cumulative moving average
  bool affine = true;
  bool track_running_stats = true;
};

// Per-channel statistics of the last Train forward, kept for metrics and the GUI.
struct BnBatchStats {
  std::vector<float> mean;     // (C,) batch mean used to normalize (global with SyncBN)
  std::vector<float> var;      // (C,) biased batch variance used to normalize
  std::vector<float> local_mean;  // (C,) this rank's own batch mean (== mean for local BN)
  std::vector<float> local_var;   // (C,) this rank's own biased variance
  int64_t count = 0;           // n used (global count with SyncBN)
  int64_t local_count = 0;
};

// BatchNorm's two elementwise passes over x (nb, c, inner), per channel ch, with the compute
// threads (any split gives the same bits): the forward's y = x * alpha[ch] + beta[ch] (saved = x
// when not null), and the input gradient dx = (dy - grad_mean[ch] - (x - mean[ch]) * k[ch]) *
// scale[ch]. BatchNorm's forward and backward run them; so does a device that computes with the
// CPU's ops from the coefficients the host's BatchNorm finished (backends/sim).
void channel_affine(const float* x, float* y, float* saved, int64_t nb, int64_t c, int64_t inner,
                    const float* alpha, const float* beta);
void channel_input_grad(const float* dy, const float* x, float* dx, int64_t nb, int64_t c, int64_t inner,
                        const float* grad_mean, const float* mean, const float* k, const float* scale);

class BatchNorm : public Module {
 public:
  explicit BatchNorm(const BatchNormOptions& opt);
  std::string kind() const override;
  std::string describe() const override;
  void forward(const Tensor& x, Tensor& y, Mode mode) override;
  void backward(const Tensor& dy, Tensor* dx) override;
  // the input, the mean and 1/std per channel (inside a fused run: BnReluPool::saved_bytes)
  int64_t saved_bytes() const override {
    return (m_x.numel() + static_cast<int64_t>(m_mean.size() + m_invstd.size())) * 4;
  }
  std::vector<Param*> params() override;
  std::vector<Buffer*> buffers() override;

  // nullptr: local BatchNorm. Otherwise SyncBatchNorm over `sync` (not owned).
  void set_sync(BnSync* sync) { m_sync = sync; }
  BnSync* sync() const { return m_sync; }
  // The hint added to the batch-of-one error ("the last batch of the epoch has ...").
  void set_error_hint(std::string hint) { m_hint = std::move(hint); }
  const std::string& error_hint() const { return m_hint; }
  const BatchNormOptions& options() const { return m_opt; }
  const BnBatchStats& last_stats() const { return m_stats; }
  // A device that ran this layer's training forward itself (executor.h: residency) brings its
  // statistics here when the host asks for them.
  void set_last_stats(BnBatchStats stats) { m_stats = std::move(stats); }
  Param& weight() { return m_weight; }
  Param& bias() { return m_bias; }
  Buffer& running_mean() { return m_running_mean; }
  Buffer& running_var() { return m_running_var; }
  Buffer& num_batches_tracked() { return m_num_batches_tracked; }

  // forward() and backward() in halves, for a caller that fuses the elementwise passes with the
  // layers around (bn_relu_pool.h); forward() and backward() are these plus one pass each.
  // prepare_forward: everything but y: the statistics (SyncBN's collectives), running statistics,
  // num_batches_tracked, the batch-of-one error, last_stats(), and y = x * alpha() + beta().
  void prepare_forward(const Tensor& x, Mode mode);
  // prepare_forward in two halves, for a caller that computes this rank's statistics elsewhere (a
  // device, executor.h). check_input: the shape checks (ConfigError). uses_batch_stats: whether a
  // forward in `mode` normalizes with batch statistics (Train, or no running statistics).
  // prepare_from_local_stats: the rest of prepare_forward from this rank's statistics per channel,
  // local_mean (C,) = bn_mean(sum of x) and local_var_sum (C,) = the sum of bn_sq_dev(x, mean) in
  // double rounded to float, as prepare_forward computes them from x (empty when
  // !uses_batch_stats(mode)). Saves nothing of x: a caller that runs backward keeps x itself.
  void check_input(const std::vector<int64_t>& shape) const;
  bool uses_batch_stats(Mode mode) const;
  // This rank's statistics of x as prepare_forward computes them (the CPU's; a device computes
  // its own): local_mean, local_var_sum (C,).
  void local_stats(const Tensor& x, std::vector<float>& local_mean, std::vector<float>& local_var_sum) const;
  void prepare_from_local_stats(const std::vector<int64_t>& shape, Mode mode, std::vector<float> local_mean,
                                std::vector<float> local_var_sum);
  // The host's part of a forward, which a device that runs the layer whole (executor.h:
  // residency) asks for before it computes the rest: check_input, the decisions below,
  // num_batches_tracked (counted on the host, which knows every forward), and the batch-of-one
  // error of a batch that normalizes with its own statistics without SyncBN. prepare_forward
  // starts with it too.
  struct ForwardPlan {
    int64_t n = 0;             // values per channel in this rank's batch
    bool batch_stats = false;  // normalize with the batch's statistics (uses_batch_stats)
    bool sync = false;         // SyncBN's collectives: train, and a BnSync of more than one rank
    bool update = false;       // the running statistics move (train, track_running_stats)
    double factor = 0.0;       // their weight: momentum, or 1 / num_batches_tracked
  };
  ForwardPlan begin_forward(const std::vector<int64_t>& shape, Mode mode);
  // SyncBN's batch-of-one error, from the global count of values per channel.
  void check_global_count(const std::vector<int64_t>& shape, int64_t count) const;
  const std::vector<float>& alpha() const { return m_alpha; }  // (C,)
  const std::vector<float>& beta() const { return m_beta; }    // (C,)
  const std::vector<float>& mean() const { return m_mean; }    // (C,) mean used to normalize
  // From this rank's sums per channel, sum_dy = sum dy and sum_dy_xmu = sum dy * (x - mean()):
  // the weight and bias gradients and SyncBN's allreduce, then (want_dx) the coefficients of
  //   dx = (dy - grad_mean - (x - mean) * k) * scale          (per channel; nullptr: no dx)
  struct InputGradCoefficients {
    std::vector<float> grad_mean, k, scale;  // (C,) each
  };
  // This rank's sums as backward computes them (the CPU's; a device computes its own): sum_dy,
  // sum_dy_xmu (C,) of dy and dy * (x - mean()) per channel. x: the last Train forward's input.
  void grad_sums(const Tensor& dy, const Tensor& x, std::vector<double>& sum_dy, std::vector<double>& sum_dy_xmu) const;
  const InputGradCoefficients* finish_backward(const std::vector<double>& sum_dy,
                                               const std::vector<double>& sum_dy_xmu, bool want_dx);

 private:
  BatchNormOptions m_opt;
  BnSync* m_sync = nullptr;
  std::string m_hint;
  Param m_weight, m_bias;
  Buffer m_running_mean, m_running_var, m_num_batches_tracked;
  BnBatchStats m_stats;
  // saved for backward (by the last Train forward)
  Tensor m_x;                   // like x: the input; backward uses x - mean, as PyTorch does
  std::vector<float> m_mean;    // (C,) mean used to normalize
  std::vector<float> m_invstd;  // (C,) 1 / sqrt(var + eps) used to normalize
  std::vector<float> m_alpha, m_beta;  // (C,) y = x * alpha + beta
  InputGradCoefficients m_coef;        // the last finish_backward()'s
  std::vector<int64_t> m_shape;
  int64_t m_count = 0;          // n behind the statistics (global with SyncBN)
  bool m_synced = false;        // the forward communicated, so backward must too
};

}  // namespace lab
