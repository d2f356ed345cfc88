// dtlab eval: a model's accuracy and loss on the test set, in eval mode (model.eval(): running
// statistics) or train mode (model.train(): the statistics of each test batch), with the softmax
// outputs of the first test samples and every sample's predicted class. Weights come from a run
// directory (--run DIR: its config.toml names the model, its final.safetensors holds the weights)
// or a safetensors file (--weights FILE --model NAME).
//
// What it answers: does a test image's prediction depend on the other images in its batch? In
// eval mode no (the same outputs at --batch-size 1 and 1000, to rounding); in train mode yes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace lab {

struct EvalCommandOptions {
  std::string run_dir;          // take the model and weights from this run directory
  std::string weights;          // safetensors file (default with --run: <run>/final.safetensors)
  int rank = 0;                 // with --run: rank R's buffers (final.rank<R>.buffers.safetensors, when
                                // its running statistics differ from rank 0's)
  std::string model;            // mlp | cnn (default with --run: the run's)
  std::string bn_mode = "eval"; // eval: model.eval(); train: model.train() (batch statistics)
  int64_t batch_size = 1000;
  int64_t limit_test = 0;       // the first N test samples (0: all)
  std::string data_dir;         // default with --run: the run's; else the Debian package's
  int64_t probe = 10;           // softmax outputs of the first `probe` test samples are reported
  int threads = 0;              // compute threads (0: one per core)
  std::string json_out;         // also write every figure as JSON
  std::FILE* out = nullptr;     // where the figures are printed (nullptr: stdout)
};

// Returns an exit code; throws lab::Error for bad options, missing files or data.
int eval_command(const EvalCommandOptions& opt);

}  // namespace lab
