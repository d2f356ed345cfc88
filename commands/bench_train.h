// dtlab bench train: training throughput in samples per second, measured the way
// tools/peers/torch_train_peer.py measures PyTorch (fixed random batch, SGD lr 0.01 momentum 0.9,
// 5 warm-up steps, rounds of about `seconds`, median step time; with several ranks, DDP over
// emulated ranks and the slowest rank's time). The step timed is the ddp mode's own iteration
// (lab/modes/mode_ddp.cpp, as `dtlab run` runs it with its default settings: ring allreduce, 25 MB
// buckets overlapped with backward, buffers broadcast before each forward, as PyTorch's DDP).
// Three modes:
//
//   one size (--batch-size B, the default)   the last line printed is `samples_per_s <N>`
//     --json: {"command": "bench train", "producer", "model", "batchnorm", "batch_size",
//              "world_size", "threads", "sgemm", "train_flops_per_sample", "gflops", "step_ms",
//              "samples_per_s", "noise", "contention"}; "batchnorm": true, false with
//              --no-batchnorm; "noise": (slowest round - fastest round) / median round, the
//              largest of any rank's; "contention": cores' worth of CPU time other programs took
//              from the cores the benchmark needed while it timed (bench_rounds.h). Every mode's
//              JSON has a top-level "noise" and "contention", the largest of what it timed.
//
//   a sweep (--batch-sizes 2,8,32,...)       "is a minibatch processed all at once?"
//     One row per size, in increasing order (a fresh model and batch per size): step ms, ms per
//     sample (step / global batch), samples/s, GFLOP/s and the per-sample speed-up against the
//     smallest size (its ms per sample / this one's). The last line printed is
//     `ratio per-sample time smallest/largest batch <x>`.
//     --json: the one-size keys without the per-size ones ("batch_size", "gflops", "step_ms",
//     "samples_per_s"), plus "batch_sizes": [...], "ratio_smallest_largest": x and
//     "sweep": [{"batch_size", "step_ms", "ms_per_sample", "samples_per_s", "gflops",
//                "speedup_per_sample", "noise", "contention"}, ...]        (e.g. "/sweep/0/ms_per_sample")
//     With --per-sample too: after the sweep, the per-sample comparison below at the largest
//     size (its lines, then the sweep's last line), and its "per_sample" object in the JSON: the
//     lab window's Benchmark view draws it as the one-at-a-time reference.
//
//   per sample (--per-sample, one rank)      the same B samples one at a time
//     The batched step (forward and backward of all B, one SGD step) next to B passes of a
//     batch of one whose gradients are accumulated, then one SGD step. The loss of the batched
//     step is the mean over B, so every per-sample gradient is scaled by 1/B as it is
//     accumulated. Both gradients are taken at the same initial weights (seed 0), before any
//     optimizer step, and compared over every parameter.
//     BatchNorm: in train mode a batch of one has no batch statistics, so per-sample processing
//     of a model with BatchNorm is not the batched computation. BatchNorm1d (mlp) sees one value
//     per channel and raises PyTorch's "Expected more than 1 value per channel when training";
//     BatchNorm2d (cnn) accepts it but normalizes the sample with its own statistics over its
//     28 x 28 positions. --per-sample-bn chooses what the per-sample passes do:
//       frozen (default): what a per-sample loop can do, freeze the statistics: BatchNorm in
//         eval mode (the model's running statistics, here the initial mean 0 and variance 1;
//         weight and bias still learn, as after model.eval() in PyTorch). The batched step keeps
//         batch statistics, so the gradients differ by far more than rounding; a second
//         comparison, the batched step with the same frozen statistics ("same_computation"),
//         shows that the per-sample loop itself changes nothing but rounding.
//       train: model.train() per sample, as a naive PyTorch loop does: the cnn normalizes each
//         sample with its own statistics (no batched step computes that: same_computation is
//         null); the mlp fails with PyTorch's error (exit 5).
//     --no-batchnorm builds the models without their BatchNorm layers (the same other layers and
//     initial weights): there both gradients agree to rounding. The last line printed is
//     `ratio per-sample/batched step time <x>`.
//     --json: the one-size keys (the batched step's figures) plus
//       "per_sample": {"batch_size", "batched_ms", "per_sample_ms", "ratio" (per_sample_ms /
//         batched_ms), "noise", "contention" (the larger of the two timings'), "grad_max_abs_diff", "grad_max_rel_diff", "grad_max_rel_param",
//         "same_computation_max_abs_diff", "same_computation_max_rel_diff",
//         "batchnorm" ("none" | "frozen" | "train"), "batchnorm_note", "train_mode_error"
//         (BatchNorm's batch-of-one error in train mode; "" when it accepts one or has no BatchNorm)}
//     Differences: max_abs = max |per-sample - batched| over every element of every gradient;
//     max_rel = max over parameters of max |per-sample - batched| / max(max |per-sample|,
//     max |batched|): relative to the tensor's largest gradient (an element that cancels to almost
//     zero would make an elementwise relative difference meaningless), and symmetric, so it stays
//     in [0, 2] where one side is zero (the bias of a Linear followed by BatchNorm has no gradient
//     with batch statistics: the mean subtracts it). Rounding gives about 1e-7 to 1e-6.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "config_effects.h"
#include "device.h"
#include "model.h"

namespace lab {

struct BenchTrainOptions {
  std::string model = "cnn";
  long long batch_size = 64;
  std::vector<long long> batch_sizes;  // non-empty: the sweep (--batch-sizes), instead of batch_size
  bool per_sample = false;             // --per-sample: batched step vs B steps of one sample
  bool batchnorm = true;               // false (--no-batchnorm): the models without BatchNorm layers
  std::string per_sample_bn = "frozen";  // --per-sample's BatchNorm: frozen (eval mode) or train
  int world_size = 1;
  int threads = 1;
  ComputeOptions compute;  // --device and its switches (device.h): ranks share one GPU
  double seconds = 0.3;
  int rounds = 7;
  std::string json_out;  // also write the figures here as JSON
  std::FILE* out = nullptr;  // where the figures are printed (nullptr: stdout)
};

// Returns an exit code. Settings that have no effect (bench_train_ineffective) are warned about on
// stderr first.
int bench_train(const BenchTrainOptions& opt);

// bench train's settings whose value differs from BenchTrainOptions' defaults and that have no
// effect: --threads with several ranks (RunConfig's rule, lab/core/config_effects.h, in the same
// words), --per-sample-bn without --per-sample or without BatchNorm, --batch-size beside
// --batch-sizes.
std::vector<IneffectiveSetting> bench_train_ineffective(const BenchTrainOptions& opt);

// How bench train builds a model's BatchNorm layers.
enum class BenchBatchNorm {
  Train,   // lab's BatchNorm: batch statistics in a training step (build_model's model itself)
  Frozen,  // BatchNorm in eval mode with gradients: running statistics, learnable weight and bias
  None,    // no BatchNorm layers; every other layer and initial weight as build_model's
};
// The model `name` ("mlp" | "cnn") initialized as build_model(name, seed) (BatchNorm draws no
// random numbers, so the other layers get the same initial weights in every variant).
std::unique_ptr<Model> build_bench_model(const std::string& name, uint64_t seed, BenchBatchNorm bn);

// dtlab bench sgemm: the sgemm backend's GFLOP/s on square (size x size) float32 matrices with
// `threads` threads, the roofline that training throughput is compared with (tools/
// bench_train_vs_torch.sh). The last line printed is `gflops <N>`. --json: {"command", "producer",
// "size", "threads", "sgemm", "gflops", "noise", "contention"} (bench_rounds.h).
struct BenchSgemmOptions {
  int size = 1024;
  int threads = 1;
  double seconds = 0.3;
  int rounds = 5;
  std::string json_out;  // also write the figures here as JSON
  std::FILE* out = nullptr;  // where the figures are printed (nullptr: stdout)
};
int bench_sgemm(const BenchSgemmOptions& opt);

}  // namespace lab
