// dtlab bench train and bench sgemm (bench_train.h says what each mode measures and prints).
//
// Sections: the models without (or with frozen) BatchNorm | timing (one training step on N
// emulated ranks; the median of rounds) | per-sample vs batched (gradients and times) | the
// command: one size, the sweep, per sample | bench sgemm
#include "bench_train.h"
#include "bench_rounds.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm_worker.h"
#include "command_line.h"
#include "communicator.h"
#include "config.h"
#include "config_effects.h"
#include "dataset.h"
#include "errors.h"
#include "events.h"
#include "faults.h"
#include "gemm.h"
#include "mode.h"
#include "model.h"
#include "mutation.h"
#include "optim.h"
#include "parallel.h"
#include "run.h"
#include "torch_rng.h"
#include "threads/transport_threads.h"

namespace lab {

// ---- the models without (or with frozen) BatchNorm ----

namespace {

// BatchNorm in eval mode, with gradients, as PyTorch computes it after model.eval(): the
// statistics are frozen (running_mean, running_var), weight and bias still learn.
//   x: (N, C) or (N, C, H, W); y = x * alpha + beta per channel with
//   alpha = weight / sqrt(running_var + eps), beta = bias - running_mean * alpha.
//   backward: dx = dy * alpha; dweight += sum dy * (x - running_mean) / sqrt(running_var + eps);
//   dbias += sum dy (sums over N, H, W, in double).
// Unlike BatchNorm in train mode it treats every sample on its own, so a batch of one is fine.
// Private to bench train: the per-sample loop's BatchNorm (bench_train.h).
class FrozenBatchNorm : public Module {
 public:
  FrozenBatchNorm(int features, int spatial_dims, double eps) : m_c(features), m_spatial(spatial_dims), m_eps(eps) {
    m_weight = {"weight", Tensor({features}, 1.0f), Tensor({features})};
    m_bias = {"bias", Tensor({features}, 0.0f), Tensor({features})};
    m_running_mean = {"running_mean", Tensor({features}, 0.0f)};
    m_running_var = {"running_var", Tensor({features}, 1.0f)};
    m_num_batches_tracked = {"num_batches_tracked", Tensor(), true, 0};
  }
  std::string kind() const override { return m_spatial == 2 ? "BatchNorm2d" : "BatchNorm1d"; }
  std::string describe() const override { return kind() + "(" + std::to_string(m_c) + ", frozen)"; }
  std::vector<Param*> params() override { return {&m_weight, &m_bias}; }
  std::vector<Buffer*> buffers() override { return {&m_running_mean, &m_running_var, &m_num_batches_tracked}; }

  void forward(const Tensor& x, Tensor& y, Mode mode) override {
    coefficients();
    const int64_t nb = x.dim(0), inner = x.numel() / std::max<int64_t>(1, nb * m_c);
    y.resize(x.shape);
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t ch = 0; ch < m_c; ++ch) {
        const float* p = x.ptr() + (b * m_c + ch) * inner;
        float* q = y.ptr() + (b * m_c + ch) * inner;
        for (int64_t i = 0; i < inner; ++i) q[i] = p[i] * m_alpha[ch] + m_beta[ch];
      }
    if (mode == Mode::Train) m_x = x;
  }

  void backward(const Tensor& dy, Tensor* dx) override {
    const int64_t nb = m_x.dim(0), inner = m_x.numel() / std::max<int64_t>(1, nb * m_c);
    if (dx) dx->resize(m_x.shape);
    for (int64_t ch = 0; ch < m_c; ++ch) {
      const float mean = m_running_mean.value.ptr()[ch];
      double sum_dy = 0, sum_dy_xhat = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t off = (b * m_c + ch) * inner;
        const float* g = dy.ptr() + off;
        const float* p = m_x.ptr() + off;
        for (int64_t i = 0; i < inner; ++i) {
          sum_dy += g[i];
          sum_dy_xhat += static_cast<double>(g[i]) * ((p[i] - mean) * m_invstd[ch]);
        }
        if (dx)
          for (int64_t i = 0; i < inner; ++i) dx->ptr()[off + i] = g[i] * m_alpha[ch];
      }
      m_weight.grad.ptr()[ch] += static_cast<float>(sum_dy_xhat);
      m_bias.grad.ptr()[ch] += static_cast<float>(sum_dy);
    }
  }

 private:
  // alpha, beta (C,) from the frozen statistics, in float as lab's BatchNorm in eval mode.
  void coefficients() {
    m_invstd.resize(static_cast<size_t>(m_c));
    m_alpha.resize(static_cast<size_t>(m_c));
    m_beta.resize(static_cast<size_t>(m_c));
    const float eps = static_cast<float>(m_eps);
    for (int64_t ch = 0; ch < m_c; ++ch) {
      m_invstd[ch] = 1.0f / std::sqrt(m_running_var.value.ptr()[ch] + eps);
      m_alpha[ch] = m_invstd[ch] * m_weight.value.ptr()[ch];
      m_beta[ch] = m_bias.value.ptr()[ch] - m_running_mean.value.ptr()[ch] * m_alpha[ch];
    }
  }

  int64_t m_c;
  int m_spatial;
  double m_eps;
  Param m_weight, m_bias;
  Buffer m_running_mean, m_running_var, m_num_batches_tracked;
  std::vector<float> m_invstd, m_alpha, m_beta;  // (C,) each
  Tensor m_x;                                    // like x: the last Train-mode input
};

}  // namespace

std::unique_ptr<Model> build_bench_model(const std::string& name, uint64_t seed, BenchBatchNorm bn) {
  ModelOptions mopt;
  mopt.name = name;
  // build_model's architecture with each BatchNorm layer replaced (Frozen) or left out (None); its
  // options are BatchNormOptions' defaults, those bench train's models use
  const double eps = BatchNormOptions().eps;
  if (bn != BenchBatchNorm::Train)
    mopt.make_batchnorm = [bn, eps](int features, int spatial_dims) -> std::unique_ptr<Module> {
      if (bn == BenchBatchNorm::Frozen) return std::make_unique<FrozenBatchNorm>(features, spatial_dims, eps);
      return nullptr;
    };
  try {
    return build_model(mopt, seed);
  } catch (const ConfigError&) {
    throw ConfigError("--model: unknown model '" + name + "'", "choose one of: mlp, cnn");
  }
}

// ---- timing ----

namespace {

constexpr int kWarmupSteps = 5;  // as tools/peers/torch_train_peer.py

// Seconds per call of fn, median, noise and contention of the rounds (bench_rounds.h): kWarmupSteps
// calls, then `rounds` rounds of about `seconds` each (at least one call). With comm (several
// ranks) every rank runs rank 0's count per round. `cores`: how many cores the benchmark keeps
// busy (all ranks' threads together).
RoundTimes median_call_seconds(const std::function<void()>& fn, double seconds, int rounds, Communicator* comm,
                               int cores) {
  for (int i = 0; i < kWarmupSteps; ++i) fn();
  double t0 = now_seconds();
  fn();
  float m = static_cast<float>(std::max(1.0, seconds / std::max(now_seconds() - t0, 1e-6)));
  // Every rank must run the same number of steps: use rank 0's count.
  if (comm) comm->broadcast(&m, sizeof m, 0, CollectiveInfo{"bench steps", -1});
  const int calls = static_cast<int>(m);
  std::vector<double> ts;
  const Contention others(cores);
  for (int round = 0; round < rounds; ++round) {
    t0 = now_seconds();
    for (int i = 0; i < calls; ++i) fn();
    ts.push_back((now_seconds() - t0) / calls);
  }
  RoundTimes r = round_times(std::move(ts));
  r.contention = others.cores();
  return r;
}

// A fixed random batch, as tools/peers/torch_train_peer.py makes it: x (B, 1, 28, 28) in [-1, 1], labels in 0..9,
// drawn from a generator seeded with the rank.
struct Batch {
  Tensor x;               // (B, 1, 28, 28)
  std::vector<int> y;     // (B,)
};
Batch random_batch(long long batch, uint64_t seed) {
  TorchGenerator g(seed);
  Batch b{Tensor({batch, 1, 28, 28}), std::vector<int>(static_cast<size_t>(batch))};
  g.uniform_(b.x.ptr(), b.x.numel(), -1.0, 1.0);
  for (int& v : b.y) v = static_cast<int>(g.random() % 10);
  return b;
}

// What bench train trains, as a run's configuration: DDP (its default settings: ring allreduce,
// 25 MB buckets overlapped with backward, buffers broadcast before each forward) of opt.world_size
// ranks at per-rank batch `batch`, SGD with lr 0.01 and momentum 0.9 as the PyTorch peer.
RunConfig bench_run_config(const BenchTrainOptions& opt, long long batch) {
  RunConfig c;
  c.mode = "ddp";
  c.model = opt.model;
  c.world_size = opt.world_size;
  c.batch_size = batch;
  c.lr = 0.01;
  c.momentum = 0.9;
  c.shuffle = false;
  c.compute = opt.compute;
  return c;
}

BenchBatchNorm batchnorm_of(const BenchTrainOptions& opt) {
  return opt.batchnorm ? BenchBatchNorm::Train : BenchBatchNorm::None;
}

// Median seconds of one training step at per-rank batch `batch` on opt.world_size emulated
// ranks, a fresh model (seed 0) and batch per call: the slowest rank's, with the largest noise of
// any rank's rounds. A step is the ddp mode's own iteration (lab/modes/mode_ddp.cpp), the code
// `dtlab run --mode ddp` runs, on a fixed batch: the run loop's data loading, records and
// evaluation are left out, as the PyTorch peer has none. A rank's error is rethrown with its type
// (a BatchNorm batch of one stays a TrainingError).
RoundTimes time_train_step(const BenchTrainOptions& opt, long long batch) {
  const int world = opt.world_size;
  const RunConfig cfg = bench_run_config(opt, batch);
  std::vector<std::unique_ptr<Model>> models(static_cast<size_t>(world));
  for (auto& m : models) m = build_bench_model(opt.model, 0, batchnorm_of(opt));
  for (int rank = 0; rank < world; ++rank)
    attach_executor(*models[static_cast<size_t>(rank)], opt.compute, rank, world, "threads");
  Dataset train;  // the samplers' size; the batches are drawn below, not from a dataset
  train.size = batch * world;
  const FaultPlan no_faults = FaultPlan::from(cfg);
  std::vector<RoundTimes> step_seconds(static_cast<size_t>(world));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  ThreadsWorld tw(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Model& model = *models[static_cast<size_t>(rank)];
        Communicator comm(tw.transport(rank), nullptr);
        CommWorker worker;  // DDP's communication thread (overlap)
        Optimizer sgd(model.params(), optimizer_options(cfg));
        sgd.set_device(model.executor());  // as a run's rank does (executor.h: residency)
        RankEnv env{cfg, rank, world, model, comm, tw.transport(rank), worker, sgd, train, no_faults, 1, 1,
                    [](int64_t) {}, [](int64_t, int64_t, int64_t) {}, nullptr};
        std::unique_ptr<RankMode> ddp = mode_of(cfg).make_rank(env);
        ddp->start();  // rank 0's state everywhere
        // A fixed batch per rank, different on every rank (the PyTorch peer seeds each rank by its rank).
        const Batch data = random_batch(batch, static_cast<uint64_t>(rank));
        std::vector<int64_t> indices(static_cast<size_t>(batch));
        for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i);
        StepInput in;
        in.indices = &indices;
        in.x = &data.x;
        in.labels = &data.y;
        StepRecord rec;
        auto step = [&] {
          ddp->before_step(in);
          ddp->step(in, rec);
        };
        step_seconds[static_cast<size_t>(rank)] =
            median_call_seconds(step, opt.seconds, opt.rounds, &comm, world == 1 ? opt.threads : world);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = std::current_exception();
        tw.transport(rank).abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      throw_error(err.exit_code(), "bench train failed at batch size " + std::to_string(batch) + ": " + err.what(),
                  err.hint());
    } catch (const std::exception& err) {
      throw Error(std::string("bench train failed: ") + err.what());
    }
  }
  RoundTimes slowest;
  for (const RoundTimes& t : step_seconds) {
    slowest.median = std::max(slowest.median, t.median);
    slowest.noise = std::max(slowest.noise, t.noise);
    slowest.contention = std::max(slowest.contention, t.contention);
  }
  return slowest;
}

// ---- per-sample vs batched ----

// Every parameter's gradient (params() order) and its state_dict name.
struct Gradients {
  std::vector<std::string> names;
  std::vector<Tensor> grads;
};
Gradients gradients_of(Model& model) {
  Gradients g;
  for (const StateEntry& e : model.state_dict())
    if (e.param) {
      g.names.push_back(e.name);
      g.grads.push_back(e.param->grad);
    }
  return g;
}

struct GradDiff {
  double max_abs = 0;   // max |a - b| over every element of every parameter
  double max_rel = 0;   // max over parameters of max |a - b| / max(max |a|, max |b|), in [0, 2]
  std::string rel_param;  // where max_rel is (a state_dict name of b's model)
};
// a and b: the same parameters in the same order (names may differ where a model lacks layers).
GradDiff compare(const Gradients& a, const Gradients& b) {
  assert(a.grads.size() == b.grads.size());
  GradDiff d;
  for (size_t p = 0; p < a.grads.size(); ++p) {
    assert(a.grads[p].shape == b.grads[p].shape);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.grads[p].data.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a.grads[p].data[i]) - b.grads[p].data[i]));
      scale = std::max({scale, std::fabs(static_cast<double>(a.grads[p].data[i])),
                        std::fabs(static_cast<double>(b.grads[p].data[i]))});
    }
    d.max_abs = std::max(d.max_abs, diff);
    const double rel = scale > 0 ? diff / scale : diff;
    if (rel > d.max_rel || d.rel_param.empty()) {
      d.max_rel = rel;
      d.rel_param = b.names[p];
    }
  }
  return d;
}

// The samples of a batch one by one: xs[i] (1, 1, 28, 28), ys[i] (1,). Cut before timing, as a
// PyTorch loop's x[i:i+1] is a view that costs nothing.
struct Samples {
  std::vector<Tensor> xs;
  std::vector<std::vector<int>> ys;
};
Samples split(const Batch& b) {
  Samples s;
  const int64_t n = b.x.dim(0), per = b.x.numel() / n;
  for (int64_t i = 0; i < n; ++i) {
    Tensor xi({1, b.x.dim(1), b.x.dim(2), b.x.dim(3)});
    std::copy(b.x.ptr() + i * per, b.x.ptr() + (i + 1) * per, xi.ptr());
    s.xs.push_back(std::move(xi));
    s.ys.push_back({b.y[static_cast<size_t>(i)]});
  }
  return s;
}

// Zeroes the gradients, then forward and backward of the whole batch (the mean loss over B).
void batched_pass(Model& model, const Batch& b, Tensor& dlogits) {
  model.zero_grad();
  const Tensor& logits = model.forward(b.x, Mode::Train);
  cross_entropy(logits, b.y, &dlogits, nullptr);
  model.backward(dlogits);
}

// Zeroes the gradients, then B forward and backward passes of one sample each, accumulated.
void per_sample_passes(Model& model, const Samples& s, Tensor& dlogits) {
  model.zero_grad();
  // mutated: a lesson's mutation test (mutation.h) leaves out the mean's 1/B
  const float batch = mutated("per-sample-sum") ? 1.0f : static_cast<float>(s.xs.size());
  for (size_t i = 0; i < s.xs.size(); ++i) {
    const Tensor& logits = model.forward(s.xs[i], Mode::Train);
    cross_entropy(logits, s.ys[i], &dlogits, nullptr);  // (1, 10): the gradient of sample i's own loss
    // The batched loss is the mean over the B samples, so each sample's gradient enters it with
    // weight 1/B: scaling dlogits scales every gradient of this backward (it is linear in
    // dlogits), and backward accumulates (+=) into the parameters' gradients.
    for (float& v : dlogits.data) v /= batch;
    model.backward(dlogits);
  }
}

struct PerSampleResult {
  double batched_seconds = 0, per_sample_seconds = 0;
  double noise = 0, contention = 0;  // the larger of the two timings' (bench_rounds.h)
  GradDiff grad;              // per-sample vs the batched step as timed
  bool has_same_computation = false;
  GradDiff same_computation;  // per-sample vs a batched step computing the same (not for "train")
  std::string train_mode_error;  // BatchNorm's batch-of-one error in train mode ("" when accepted)
};

// How the per-sample passes build BatchNorm: none without it, else --per-sample-bn's choice.
BenchBatchNorm per_sample_batchnorm(const BenchTrainOptions& opt) {
  if (!opt.batchnorm) return BenchBatchNorm::None;
  return opt.per_sample_bn == "train" ? BenchBatchNorm::Train : BenchBatchNorm::Frozen;
}

PerSampleResult run_per_sample(const BenchTrainOptions& opt, long long batch_size) {
  PerSampleResult r;
  const Batch data = random_batch(batch_size, 0);  // rank 0's batch of the timed batched step
  const Samples samples = split(data);
  const BenchBatchNorm per_sample_bn = per_sample_batchnorm(opt);
  Tensor dlogits;

  if (opt.batchnorm) {
    // What train mode does with a batch of one, on a model of its own: BatchNorm1d (mlp) has one
    // value per channel and raises PyTorch's error; BatchNorm2d (cnn) has 28 x 28 and normalizes
    // the sample with its own statistics.
    auto probe = build_bench_model(opt.model, 0, BenchBatchNorm::Train);
    try {
      probe->forward(samples.xs[0], Mode::Train);
    } catch (const TrainingError& e) {
      r.train_mode_error = e.what();
      if (per_sample_bn == BenchBatchNorm::Train)
        throw TrainingError("--per-sample-bn train: " + r.train_mode_error,
                            "a batch of one has no batch statistics here; --per-sample-bn frozen runs the per-sample "
                            "passes with frozen statistics (BatchNorm in eval mode)");
    }
  }

  // Gradients at the initial weights (seed 0), before any optimizer step.
  auto batched_model = build_bench_model(opt.model, 0, batchnorm_of(opt));
  batched_pass(*batched_model, data, dlogits);
  const Gradients batched = gradients_of(*batched_model);
  auto per_sample_model = build_bench_model(opt.model, 0, per_sample_bn);
  per_sample_passes(*per_sample_model, samples, dlogits);
  const Gradients per_sample = gradients_of(*per_sample_model);
  r.grad = compare(per_sample, batched);
  if (per_sample_bn == BenchBatchNorm::Frozen) {
    auto frozen = build_bench_model(opt.model, 0, BenchBatchNorm::Frozen);
    batched_pass(*frozen, data, dlogits);
    r.same_computation = compare(per_sample, gradients_of(*frozen));
    r.has_same_computation = true;
  } else if (per_sample_bn == BenchBatchNorm::None) {
    r.same_computation = r.grad;
    r.has_same_computation = true;
  }

  // Times: the batched step exactly as the one-size mode times it, and the per-sample step.
  const RoundTimes batched_time = time_train_step(opt, batch_size);
  r.batched_seconds = batched_time.median;
  auto timed = build_bench_model(opt.model, 0, per_sample_bn);
  Optimizer sgd(timed->params(), optimizer_options(bench_run_config(opt, batch_size)));
  const RoundTimes one_by_one = median_call_seconds(
      [&] {
        per_sample_passes(*timed, samples, dlogits);
        sgd.step();
      },
      opt.seconds, opt.rounds, nullptr, opt.threads);
  r.per_sample_seconds = one_by_one.median;
  r.noise = std::max(batched_time.noise, one_by_one.noise);
  r.contention = std::max(batched_time.contention, one_by_one.contention);
  return r;
}

}  // namespace

// ---- the command ----

std::vector<IneffectiveSetting> bench_train_ineffective(const BenchTrainOptions& opt) {
  const BenchTrainOptions d;
  std::vector<IneffectiveSetting> out;
  if (opt.threads != d.threads) {
    RunConfig c;  // the run's rule: Run::start and bench train give every rank of several one thread
    c.model = opt.model;
    c.world_size = opt.world_size;
    const std::string why = no_effect_reason(c, "threads");
    if (!why.empty()) out.push_back({"threads", "--threads " + std::to_string(opt.threads), why, "", false, false});
  }
  if (opt.per_sample_bn != d.per_sample_bn && (!opt.per_sample || !opt.batchnorm))
    out.push_back({"per_sample_bn", "--per-sample-bn " + opt.per_sample_bn,
                   opt.per_sample ? "--no-batchnorm builds the model without BatchNorm layers"
                                  : "it chooses the BatchNorm of --per-sample's passes, and --per-sample is not given",
                   "", false, false});
  if (opt.batch_size != d.batch_size && !opt.batch_sizes.empty())
    out.push_back({"batch_size", "--batch-size " + std::to_string(opt.batch_size),
                   "--batch-sizes runs the sweep instead", "", false, false});
  return out;
}

int bench_train(const BenchTrainOptions& opt) {
  std::FILE* out = opt.out ? opt.out : stdout;
  for (const IneffectiveSetting& e : bench_train_ineffective(opt)) std::fprintf(stderr, "dtlab: warning: %s\n", e.message().c_str());
  if (opt.batch_size <= 0)
    throw ConfigError("batch_size should be a positive integer value, but got batch_size=" + std::to_string(opt.batch_size));
  for (long long b : opt.batch_sizes)
    if (b < 1)
      throw ConfigError("--batch-sizes: every batch size must be at least 1, got " + std::to_string(b),
                        "give a comma-separated list such as --batch-sizes 2,8,32,128,512");
  if (opt.world_size < 1 || opt.world_size > kMaxWorldSize)
    throw ConfigError("--world-size must be in 1.." + std::to_string(kMaxWorldSize));
  if (opt.threads < 1) throw ConfigError("--threads must be at least 1");
  if (opt.rounds < 1 || !(opt.seconds > 0)) throw ConfigError("--rounds and --seconds must be positive");
  validate_compute_options(opt.compute);
  if (opt.compute.cuda_graphs) refuse_graphs_where_they_cannot_apply(bench_run_config(opt, opt.batch_size));
  rank_device_map(opt.compute, opt.world_size, "threads");  // --rank-devices: one per rank
  const bool on_cpu = parse_device(opt.compute.device).is_cpu();
  if (opt.per_sample && !on_cpu)
    throw ConfigError("--per-sample compares gradients on the CPU reference: not with --device " + opt.compute.device);
  if (opt.per_sample && opt.world_size != 1)
    throw ConfigError("--per-sample runs one rank, got --world-size " + std::to_string(opt.world_size));
  if (opt.per_sample_bn != "frozen" && opt.per_sample_bn != "train")
    throw ConfigError("--per-sample-bn: expected frozen or train, got '" + opt.per_sample_bn + "'");
  const bool sweep = !opt.batch_sizes.empty();
  std::vector<long long> sizes = sweep ? opt.batch_sizes : std::vector<long long>{opt.batch_size};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

  const int world = opt.world_size;
  const int threads = world == 1 ? opt.threads : 1;
  set_compute_threads(threads);
  std::string size_text;
  for (long long b : sizes) size_text += (size_text.empty() ? "" : ",") + std::to_string(b);
  // The model that counts FLOPs; on a device it also gets an executor first, so that a missing GPU
  // fails before anything is printed.
  auto flops_model = build_bench_model(opt.model, 0, batchnorm_of(opt));
  attach_executor(*flops_model, opt.compute, 0, 1, "threads");
  std::string device_text = on_cpu ? "" : " device=" + opt.compute.device;
  if (!on_cpu && opt.compute.allow_tf32) device_text += " allow_tf32=on";
  if (!on_cpu && opt.compute.cudnn_benchmark) device_text += " cudnn_benchmark=on";
  if (!on_cpu && opt.compute.cudnn_deterministic) device_text += " cudnn_deterministic=on";
  if (opt.compute.cuda_graphs) device_text += " cuda_graphs=on";
  std::fprintf(out, "# dtlab %s bench train model=%s %s=%s world_size=%d threads=%d sgemm=%s batchnorm=%s%s%s\n",
               kDtlabVersion, opt.model.c_str(), sweep ? "batch_sizes" : "batch_size", size_text.c_str(), world,
               threads, gemm_backend_name(), opt.batchnorm ? "on" : "off", opt.per_sample ? " per_sample=on" : "",
               device_text.c_str());
  std::fflush(out);
  const int64_t flops = flops_model->train_flops_per_sample({1, 28, 28});
  flops_model.reset();
  nlohmann::json j = {{"command", "bench train"},
                      {"producer", std::string("dtlab ") + kDtlabVersion},
                      {"model", opt.model},
                      {"batchnorm", opt.batchnorm},
                      {"world_size", world},
                      {"threads", threads},
                      {"sgemm", gemm_backend_name()},
                      {"device", opt.compute.device},
                      {"train_flops_per_sample", flops}};
  std::fprintf(out, "train_flops_per_sample %lld\n", static_cast<long long>(flops));
  auto gflops_of = [&](double sps) { return sps * static_cast<double>(flops) / 1e9; };

  // The per-sample comparison at batch size b: printed, and returned as the JSON's "per_sample".
  struct PerSamplePart {
    nlohmann::json json;
    double batched_seconds = 0, ratio = 0, noise = 0, contention = 0;
  };
  auto per_sample_part = [&](long long b) {
    const PerSampleResult r = run_per_sample(opt, b);
    const double sps = static_cast<double>(b) / r.batched_seconds;
    const double ratio = r.per_sample_seconds / r.batched_seconds;
    const BenchBatchNorm psbn = per_sample_batchnorm(opt);
    const std::string bn = psbn == BenchBatchNorm::None ? "none" : psbn == BenchBatchNorm::Frozen ? "frozen" : "train";
    std::string note;
    if (psbn == BenchBatchNorm::None)
      note = "the models are built without BatchNorm (--no-batchnorm): both steps compute the same function";
    else if (psbn == BenchBatchNorm::Frozen)
      note = "the batched step normalizes with the batch's statistics (train mode); the per-sample passes freeze "
             "them: BatchNorm in eval mode (running statistics, the initial mean 0 and variance 1), weight and bias "
             "still learning";
    else
      note = "the batched step normalizes with the batch's statistics, each per-sample pass with its one sample's "
             "own statistics (train mode; BatchNorm2d over the sample's positions)";
    std::fprintf(out, "batchnorm: %s: %s\n", bn.c_str(), note.c_str());
    if (opt.batchnorm)
      std::fprintf(out, "train mode on a batch of one: %s\n",
                   r.train_mode_error.empty() ? "accepted (BatchNorm2d: 28 x 28 values per channel, the sample's own "
                                                "statistics)"
                                              : r.train_mode_error.c_str());
    std::fprintf(out, "gradients before the optimizer step, every parameter (rel: max |diff| / the larger max |gradient| "
                      "per tensor):\n");
    std::fprintf(out, "  per-sample vs batched step:             max abs diff %.3e  max rel diff %.3e (%s)\n",
                 r.grad.max_abs, r.grad.max_rel, r.grad.rel_param.c_str());
    if (psbn == BenchBatchNorm::Frozen)
      std::fprintf(out, "  per-sample vs batched, same frozen BN:  max abs diff %.3e  max rel diff %.3e (%s)\n",
                   r.same_computation.max_abs, r.same_computation.max_rel, r.same_computation.rel_param.c_str());
    std::fprintf(out, "batched_ms %.3f  (one step of %lld samples, %.1f samples/s)\n", r.batched_seconds * 1e3, b,
                 sps);
    std::fprintf(out, "per_sample_ms %.3f  (%lld passes of one sample, gradients accumulated x 1/%lld, one SGD step; "
                 "%.1f samples/s)\n",
                 r.per_sample_seconds * 1e3, b, b, static_cast<double>(b) / r.per_sample_seconds);
    std::fprintf(out, "ratio per-sample/batched step time %.2f\n", ratio);
    std::fflush(out);
    const nlohmann::json none;  // null: no batched step computes what the per-sample passes do
    PerSamplePart p;
    p.batched_seconds = r.batched_seconds;
    p.ratio = ratio;
    p.noise = r.noise;
    p.contention = r.contention;
    p.json = {{"batch_size", b},
              {"batched_ms", r.batched_seconds * 1e3},
              {"per_sample_ms", r.per_sample_seconds * 1e3},
              {"ratio", ratio},
              {"noise", r.noise},
              {"contention", r.contention},
              {"grad_max_abs_diff", r.grad.max_abs},
              {"grad_max_rel_diff", r.grad.max_rel},
              {"grad_max_rel_param", r.grad.rel_param},
              {"same_computation_max_abs_diff", r.has_same_computation ? nlohmann::json(r.same_computation.max_abs) : none},
              {"same_computation_max_rel_diff", r.has_same_computation ? nlohmann::json(r.same_computation.max_rel) : none},
              {"batchnorm", bn},
              {"batchnorm_note", note},
              {"train_mode_error", r.train_mode_error}};
    return p;
  };

  if (sweep) {
    // Each row is a fresh model and batch, one size after the other; the smallest comes first.
    std::fprintf(out, "%10s %10s %14s %12s %9s %22s\n", "batch", "step_ms", "ms_per_sample", "samples/s", "GFLOP/s",
                 "speedup_per_sample");
    std::fflush(out);
    double first_ms_per_sample = 0, last_ms_per_sample = 0, noise = 0, contention = 0;
    for (long long b : sizes) {
      const RoundTimes timed = time_train_step(opt, b);
      const double step = timed.median;
      noise = std::max(noise, timed.noise);
      contention = std::max(contention, timed.contention);
      const double global_batch = static_cast<double>(b) * world;
      const double sps = global_batch / step;
      const double ms_per_sample = step * 1e3 / global_batch;
      if (b == sizes.front()) first_ms_per_sample = ms_per_sample;
      last_ms_per_sample = ms_per_sample;
      const double speedup = first_ms_per_sample / ms_per_sample;
      std::fprintf(out, "%10lld %10.3f %14.5f %12.1f %9.1f %21.2fx\n", b, step * 1e3, ms_per_sample, sps,
                   gflops_of(sps), speedup);
      std::fflush(out);
      j["sweep"].push_back({{"batch_size", b},
                            {"step_ms", step * 1e3},
                            {"ms_per_sample", ms_per_sample},
                            {"samples_per_s", sps},
                            {"gflops", gflops_of(sps)},
                            {"speedup_per_sample", speedup},
                            {"noise", timed.noise},
                            {"contention", timed.contention}});
    }
    const double ratio = first_ms_per_sample / last_ms_per_sample;
    j["batch_sizes"] = sizes;
    j["ratio_smallest_largest"] = ratio;
    if (opt.per_sample) {
      // the largest batch of the sweep, one sample at a time
      std::fprintf(out, "\nper sample: the batch of %lld one sample at a time\n", sizes.back());
      const PerSamplePart p = per_sample_part(sizes.back());
      j["per_sample"] = p.json;
      noise = std::max(noise, p.noise);
      contention = std::max(contention, p.contention);
    }
    j["noise"] = noise;  // the largest of any timing's
    j["contention"] = contention;
    if (!opt.json_out.empty()) write_result_json(opt.json_out, j);
    std::fprintf(out, "ratio per-sample time smallest/largest batch %.2f\n", ratio);
    return kExitOk;
  }

  const long long b = sizes.front();
  if (opt.per_sample) {
    const PerSamplePart p = per_sample_part(b);
    const double sps = static_cast<double>(b) / p.batched_seconds;
    j["batch_size"] = b;
    j["gflops"] = gflops_of(sps);
    j["step_ms"] = p.batched_seconds * 1e3;
    j["samples_per_s"] = sps;
    j["per_sample"] = p.json;
    j["noise"] = p.noise;
    j["contention"] = p.contention;
    if (!opt.json_out.empty()) write_result_json(opt.json_out, j);
    return kExitOk;
  }

  const RoundTimes timed = time_train_step(opt, b);
  const double slowest = timed.median;
  const double sps = static_cast<double>(b) * world / slowest;
  std::fprintf(out, "gflops %.1f\n", gflops_of(sps));
  std::fprintf(out, "step_ms %.3f\n", slowest * 1e3);
  std::fprintf(out, "samples_per_s %.1f\n", sps);
  j["batch_size"] = b;
  j["gflops"] = gflops_of(sps);
  j["step_ms"] = slowest * 1e3;
  j["samples_per_s"] = sps;
  j["noise"] = timed.noise;
  j["contention"] = timed.contention;
  if (!opt.json_out.empty()) write_result_json(opt.json_out, j);
  return kExitOk;
}

// ---- bench sgemm ----

int bench_sgemm(const BenchSgemmOptions& opt) {
  std::FILE* out = opt.out ? opt.out : stdout;
  if (opt.size < 1 || opt.size > 8192) throw ConfigError("--size must be in 1..8192");
  if (opt.threads < 1) throw ConfigError("--threads must be at least 1");
  if (opt.rounds < 1 || !(opt.seconds > 0)) throw ConfigError("--rounds and --seconds must be positive");
  gemm_set_threads(opt.threads);
  const int n = opt.size;
  std::fprintf(out, "# dtlab %s bench sgemm size=%d threads=%d sgemm=%s (C = A B^T, row-major, float32)\n", kDtlabVersion,
              n, opt.threads, gemm_backend_name());
  std::fflush(out);
  Tensor a({n, n}, 0.5f), b({n, n}, 0.25f), c({n, n});
  auto call = [&] { sgemm(false, true, n, n, n, 1.0f, a.ptr(), n, b.ptr(), n, 0.0f, c.ptr(), n); };
  for (int i = 0; i < 3; ++i) call();
  double t0 = now_seconds();
  call();
  const int calls = static_cast<int>(std::max(1.0, opt.seconds / std::max(now_seconds() - t0, 1e-6)));
  std::vector<double> ts;
  const Contention others(opt.threads);
  for (int round = 0; round < opt.rounds; ++round) {
    t0 = now_seconds();
    for (int i = 0; i < calls; ++i) call();
    ts.push_back((now_seconds() - t0) / calls);
  }
  RoundTimes timed = round_times(std::move(ts));
  timed.contention = others.cores();
  const double gflops = 2.0 * n * n * n / timed.median / 1e9;
  std::fprintf(out, "gflops %.1f\n", gflops);
  if (!opt.json_out.empty())
    write_result_json(opt.json_out, {{"command", "bench sgemm"},
                                     {"producer", std::string("dtlab ") + kDtlabVersion},
                                     {"size", n},
                                     {"threads", opt.threads},
                                     {"sgemm", gemm_backend_name()},
                                     {"gflops", gflops},
                                     {"noise", timed.noise},
                                     {"contention", timed.contention}});
  return kExitOk;
}

}  // namespace lab
