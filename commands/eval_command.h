// dtlab eval: a model's accuracy and loss on the test set, in eval mode (model.eval(): running
// statistics) or train mode (model.train(): the statistics of each test batch), with the softmax
// outputs of the first test samples and every sample's predicted class. Weights come from a run
// directory (--run DIR: its config.toml names the model, its final.safetensors holds the weights)
// or a safetensors file (--weights FILE --model NAME).
//
// What it answers: does a test image's prediction depend on the other images in its batch? In
// eval mode no (the same outputs at --batch-size 1 and 1000, to rounding); in train mode yes.
//
// --autocast bf16: does autocast help inference on a CPU? The model runs as under
// torch.autocast("cpu", dtype=torch.bfloat16) (Model::set_autocast: Linear and Conv2d on bf16
// operands with float32 sums, every activation PyTorch holds in bf16 rounded to bf16), and the
// same command also evaluates the float32 model: accuracy, loss and samples/s of both (each the
// best of kAutocastRounds rounds over the test set, bf16 and fp32 rounds alternating), top-1
// agreement (share of test samples with the same predicted class), the largest difference of
// the probe samples' softmax outputs, and the speed ratio. Eval mode only: --bn-mode train with
// --autocast bf16 is refused (PyTorch's bf16 batch-statistics kernels are not emulated).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "device.h"

namespace lab {

struct EvalCommandOptions {
  std::string run_dir;          // take the model and weights from this run directory
  std::string weights;          // safetensors file (default with --run: <run>/final.safetensors)
  int rank = 0;                 // with --run: rank R's buffers (final.rank<R>.buffers.safetensors, when
                                // its running statistics differ from rank 0's)
  std::string model;            // mlp | cnn (default with --run: the run's)
  std::string bn_mode = "eval"; // eval: model.eval(); train: model.train() (batch statistics)
  int64_t batch_size = 1000;
  int64_t limit_test = -1;      // the first N test samples (0: all; -1: the run's --limit-test with --run, else all)
  std::string data_dir;         // default with --run: the run's; else the Debian package's
  int64_t probe = 3;            // softmax outputs of the first `probe` test samples are reported
  int threads = 0;              // compute threads (0: one per core)
  std::string json_out;         // also write every figure as JSON
  std::string autocast = "none";  // none | bf16: torch.autocast("cpu", dtype=torch.bfloat16), beside fp32
  ComputeOptions compute;         // --device (device.h): where the forwards run; cpu by default
  std::FILE* out = nullptr;     // where the figures are printed (nullptr: stdout)
};

// --autocast bf16: rounds over the test set per precision; the best (fastest) one is reported.
constexpr int kAutocastRounds = 3;

// Returns an exit code; throws lab::Error for bad options, missing files or data.
int eval_command(const EvalCommandOptions& opt);

}  // namespace lab
