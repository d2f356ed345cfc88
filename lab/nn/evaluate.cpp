#include "evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mutation.h"
#include "optim.h"

namespace lab {

namespace {

// softmax of one row of logits z: (k,), in double as PyTorch's users print it, stored as float
void softmax_row(const float* z, int64_t k, float* out) {
  float zmax = z[0];
  for (int64_t j = 1; j < k; ++j) zmax = std::max(zmax, z[j]);
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(z[j] - zmax));
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<float>(std::exp(static_cast<double>(z[j] - zmax)) / sum);
}

}  // namespace

EvalResult evaluate(Model& model, Mode mode, const Dataset& data, int64_t batch_size, int64_t begin, int64_t end,
                    const EvalOutputs& out) {
  // (a lesson's mutation test, mutation.h: model.train() at test time made to change nothing)
  if (mode == Mode::Train && mutated("eval-train-mode-as-eval")) mode = Mode::Eval;
  EvalResult r;
  Tensor x;
  std::vector<int> labels;
  double loss_sum = 0;
  int64_t correct_sum = 0;
  if (out.predictions) out.predictions->assign(static_cast<size_t>(std::max<int64_t>(0, end - begin)), -1);
  const int64_t probe = std::max<int64_t>(0, std::min(out.probe, end - begin));
  if (out.probe_probs) out.probe_probs->assign(static_cast<size_t>(probe) * 10, 0.0f);
  for (int64_t s = begin; s < end;) {
    int64_t n = std::min(batch_size, end - s);
    if (mode == Mode::Train && end - (s + n) == 1) n += 1;
    x.resize({n, 1, 28, 28});
    labels.resize(static_cast<size_t>(n));
    std::memcpy(x.ptr(), data.images.data() + s * 784, static_cast<size_t>(n) * 784 * sizeof(float));
    for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = data.labels[static_cast<size_t>(s + i)];
    const Tensor& logits = model.forward(x, mode);  // (n, k)
    const int64_t k = logits.shape.back();
    if (out.first_probs && s == begin) {
      out.first_probs->assign(static_cast<size_t>(k), 0.0f);
      softmax_row(logits.ptr(), k, out.first_probs->data());
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t idx = s + i - begin;
      const float* z = logits.ptr() + i * k;
      if (out.predictions)
        (*out.predictions)[static_cast<size_t>(idx)] = static_cast<int>(std::max_element(z, z + k) - z);
      if (out.probe_probs && idx < probe && k == 10) softmax_row(z, k, out.probe_probs->data() + idx * 10);
    }
    int correct = 0;
    const float loss = cross_entropy(logits, labels, nullptr, &correct);
    loss_sum += static_cast<double>(loss) * static_cast<double>(n);
    correct_sum += correct;
    s += n;
  }
  r.samples = end - begin;
  if (r.samples > 0) {
    r.loss = loss_sum / static_cast<double>(r.samples);
    r.acc = static_cast<double>(correct_sum) / static_cast<double>(r.samples);
  }
  return r;
}

}  // namespace lab
