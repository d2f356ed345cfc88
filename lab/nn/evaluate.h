// evaluate(): a model's loss and accuracy on a slice of a dataset, in eval mode (running
// statistics) or train mode (batch statistics of each batch), as `model.eval()` / `model.train()`
// followed by a no-grad loop over a DataLoader without shuffling. Used by the run (per epoch, at
// the end, periodically) and by `dtlab eval`.
#pragma once

#include <cstdint>
#include <vector>

#include "dataset.h"
#include "model.h"

namespace lab {

struct EvalResult {
  double loss = 0, acc = 0;
  int64_t samples = 0;
};

// Optional outputs of evaluate(), filled when the pointer is set.
struct EvalOutputs {
  std::vector<float>* first_probs = nullptr;  // (10,) softmax of sample `begin`
  std::vector<int>* predictions = nullptr;    // (end - begin,) argmax of every sample
  std::vector<float>* probe_probs = nullptr;  // (probe, 10) softmax of the first `probe` samples
  int64_t probe = 0;
};

// Samples [begin, end) of `data` in batches of batch_size (in train mode a trailing batch of one
// sample is folded into the one before: batch statistics need two values per channel). In train
// mode the model's running statistics move, as they do in PyTorch: pass a copy to keep them.
EvalResult evaluate(Model& model, Mode mode, const Dataset& data, int64_t batch_size, int64_t begin, int64_t end,
                    const EvalOutputs& out = {});

}  // namespace lab
