#include "pipeline.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <sstream>

#include "batchnorm.h"
#include "errors.h"
#include "model.h"

namespace lab {

// ---- stages ----

namespace {

std::vector<int> parse_balance(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    size_t used = 0;
    long v = -1;
    try {
      v = std::stol(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size())
      throw ConfigError("--balance '" + text + "': '" + part + "' is not a number of modules",
                        "give the modules of each stage, comma-separated, e.g. --balance 2,3,2,1");
    out.push_back(static_cast<int>(v));
  }
  return out;
}

std::string module_list(Model& model, size_t begin, size_t end) {
  std::string s;
  for (size_t i = begin; i < end; ++i) s += (i > begin ? ", " : "") + model.module(i).describe();
  return s;
}

}  // namespace

std::vector<PipelineStage> pipeline_stages(Model& model, int stages, const std::string& balance,
                                           const std::string& model_name) {
  const size_t n = model.size();
  std::vector<PipelineStage> out;
  if (stages < 1) throw ConfigError("--stages must be at least 1, got " + std::to_string(stages));
  if (!balance.empty()) {
    const std::vector<int> counts = parse_balance(balance);
    if (static_cast<int>(counts.size()) != stages)
      throw ConfigError("--balance " + balance + " gives " + std::to_string(counts.size()) + " stages, --stages is " +
                            std::to_string(stages),
                        "give one module count per stage");
    size_t at = 0;
    for (size_t s = 0; s < counts.size(); ++s) {
      if (counts[s] <= 0)
        throw ConfigError("--balance " + balance + ": stage " + std::to_string(s) + " would be empty (" +
                              std::to_string(counts[s]) + " modules)",
                          "every stage needs at least one module of the " + model_name + "'s " + std::to_string(n));
      out.push_back({at, at + static_cast<size_t>(counts[s])});
      at += static_cast<size_t>(counts[s]);
    }
    if (at != n)
      throw ConfigError("--balance " + balance + " covers " + std::to_string(at) + " modules, the " + model_name +
                            " has " + std::to_string(n) + ": " + model.describe(),
                        "the module counts must add up to " + std::to_string(n));
    return out;
  }
  // Automatic: a stage starts at a module with matrix products (or at module 0)
  std::vector<int64_t> macs(n, 0);
  {
    std::vector<int64_t> per = model.module_macs({1, 28, 28});
    for (size_t i = 0; i < n; ++i) macs[i] = per[i];
  }
  std::vector<size_t> layers;  // modules with matrix products
  for (size_t i = 0; i < n; ++i)
    if (macs[i] > 0) layers.push_back(i);
  std::vector<size_t> cuts_possible(layers.begin() + (layers.empty() ? 0 : 1), layers.end());
  if (stages - 1 > static_cast<int>(cuts_possible.size())) {
    std::string names;
    for (size_t i : layers) names += (names.empty() ? "" : ", ") + model.module(i).describe();
    throw ConfigError("--stages " + std::to_string(stages) + ": the " + model_name + " has " +
                          std::to_string(layers.size()) + " layers with matrix products to start a stage at (" + names +
                          "), so at most " + std::to_string(layers.size()) + " stages",
                      "fewer stages, or --balance to cut elsewhere (modules per stage, adding up to " +
                          std::to_string(n) + ")");
  }
  // Every choice of stages - 1 cuts (a handful): the smallest largest stage, the first such choice
  const size_t k = static_cast<size_t>(stages - 1);
  std::vector<size_t> pick(k), best;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < k; ++i) pick[i] = i;
  while (true) {
    std::vector<size_t> bounds{0};
    for (size_t i : pick) bounds.push_back(cuts_possible[i]);
    bounds.push_back(n);
    int64_t worst = 0;
    for (size_t s = 0; s + 1 < bounds.size(); ++s) {
      int64_t c = 0;
      for (size_t m = bounds[s]; m < bounds[s + 1]; ++m) c += macs[m];
      worst = std::max(worst, c);
    }
    if (worst < best_cost) best_cost = worst, best = bounds;
    // next combination
    size_t i = k;
    while (i > 0 && pick[i - 1] == cuts_possible.size() - k + i - 1) --i;
    if (i == 0) break;
    ++pick[i - 1];
    for (size_t j = i; j < k; ++j) pick[j] = pick[j - 1] + 1;
  }
  for (size_t s = 0; s + 1 < best.size(); ++s) out.push_back({best[s], best[s + 1]});
  return out;
}

std::string balance_text(const std::vector<PipelineStage>& stages) {
  std::string s;
  for (const PipelineStage& st : stages) s += (s.empty() ? "" : ",") + std::to_string(st.end - st.begin);
  return s;
}

std::string stage_map_text(Model& model, const std::vector<PipelineStage>& stages) {
  std::string s;
  for (size_t i = 0; i < stages.size(); ++i)
    s += (i ? " | " : "") + std::to_string(i) + ": " + module_list(model, stages[i].begin, stages[i].end);
  return s;
}

// ---- schedules ----

void check_schedule_name(const std::string& schedule) {
  if (schedule != "gpipe" && schedule != "1f1b")
    throw ConfigError("--schedule: unknown pipeline schedule '" + schedule + "'",
                      "choose gpipe (every forward, then every backward) or 1f1b (one forward, one backward)");
}

std::vector<PipeStep> pipeline_schedule(const std::string& schedule, int stages, int stage, int micro) {
  check_schedule_name(schedule);
  assert(stage >= 0 && stage < stages && micro >= 0);
  std::vector<PipeStep> out;
  if (schedule == "gpipe") {
    for (int m = 0; m < micro; ++m) out.push_back({PipeOp::Forward, m});
    for (int m = micro; m-- > 0;) out.push_back({PipeOp::Backward, m});  // reverse: autograd's order in Pipe
    return out;
  }
  // 1F1B (Megatron-LM's forward_backward_pipelining_without_interleaving)
  const int warmup = std::min(stages - stage - 1, micro);
  const int remaining = micro - warmup;
  int f = 0, b = 0;
  for (int i = 0; i < warmup; ++i) out.push_back({PipeOp::Forward, f++});
  for (int i = 0; i < remaining; ++i) {
    out.push_back({PipeOp::Forward, f++});
    out.push_back({PipeOp::Backward, b++});
  }
  while (b < micro) out.push_back({PipeOp::Backward, b++});
  return out;
}

int peak_in_flight(const std::vector<PipeStep>& schedule) {
  int now = 0, peak = 0;
  for (const PipeStep& s : schedule) {
    now += s.op == PipeOp::Forward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

// ---- the timeline ----

PipeTimeline simulate_pipeline(const std::string& schedule, int stages, int micro, double forward_cost,
                               double backward_cost) {
  return simulate_pipeline(schedule, stages, micro, std::vector<double>(static_cast<size_t>(stages), forward_cost),
                           std::vector<double>(static_cast<size_t>(stages), backward_cost));
}

PipeTimeline simulate_pipeline(const std::string& schedule, int stages, int micro,
                               const std::vector<double>& forward_cost, const std::vector<double>& backward_cost) {
  std::vector<std::vector<PipeStep>> orders;
  for (int s = 0; s < stages; ++s) orders.push_back(pipeline_schedule(schedule, stages, s, micro));
  return simulate_orders(orders, forward_cost, backward_cost);
}

PipeTimeline simulate_orders(const std::vector<std::vector<PipeStep>>& order, const std::vector<double>& forward_cost,
                             const std::vector<double>& backward_cost) {
  PipeTimeline t;
  const size_t P = order.size();
  size_t M = 0;
  for (const auto& o : order) {
    t.peak_in_flight.push_back(peak_in_flight(o));
    for (const PipeStep& st : o) M = std::max(M, static_cast<size_t>(st.micro) + 1);
  }
  const double unset = -1;
  std::vector<std::vector<double>> fwd_end(P, std::vector<double>(M, unset)), bwd_end = fwd_end;
  std::vector<size_t> next(P, 0);
  std::vector<double> free_at(P, 0.0);
  size_t left = 0;
  for (const auto& o : order) left += o.size();
  while (left > 0) {
    bool progressed = false;
    for (size_t s = 0; s < P; ++s) {
      while (next[s] < order[s].size()) {
        const PipeStep st = order[s][next[s]];
        const size_t m = static_cast<size_t>(st.micro);
        double ready;
        if (st.op == PipeOp::Forward) ready = s == 0 ? 0.0 : fwd_end[s - 1][m];
        else ready = s + 1 == P ? fwd_end[s][m] : bwd_end[s + 1][m];
        if (ready == unset) break;
        const double start = std::max(ready, free_at[s]);
        const double end = start + (st.op == PipeOp::Forward ? forward_cost[s] : backward_cost[s]);
        (st.op == PipeOp::Forward ? fwd_end : bwd_end)[s][m] = end;
        free_at[s] = end;
        t.blocks.push_back({static_cast<int>(s), st.op, st.micro, start, end});
        ++next[s];
        --left;
        progressed = true;
      }
    }
    if (!progressed) throw Error("a pipeline's orders of blocks deadlock: a block waits for one that never runs");
  }
  double busy = 0;
  for (const PipeBlock& b : t.blocks) t.makespan = std::max(t.makespan, b.end), busy += b.end - b.start;
  t.bubble = t.makespan > 0 ? 1.0 - busy / (static_cast<double>(P) * t.makespan) : 0.0;
  return t;
}

double bubble_formula(int stages, int micro) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro + stages - 1);
}

double measured_bubble(const std::vector<double>& busy, double span) {
  if (span <= 0 || busy.empty()) return 0.0;
  double total = 0;
  for (double b : busy) total += b;
  return std::max(0.0, 1.0 - total / (static_cast<double>(busy.size()) * span));
}

// ---- deferred BatchNorm ----

bool DeferredBatchNormStats::track(const Tensor& x, int chunks) {
  assert(x.ndim() >= 2);
  const int64_t nb = x.dim(0), c = x.dim(1);
  const int64_t inner = x.numel() / std::max<int64_t>(1, nb * c);
  if (m_sum.empty()) m_sum.assign(static_cast<size_t>(c), 0.0f), m_sum_squares.assign(static_cast<size_t>(c), 0.0f);
  // input.sum(dim) and (input ** 2).sum(dim) per channel, each added to the float32 running sum
  // (PyTorch's reduction adds in its own order: the per-channel sums agree to rounding)
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0, sq = 0;
    for (int64_t b = 0; b < nb; ++b) {
      const float* p = x.ptr() + (b * c + ch) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        s += p[i];
        const float v2 = p[i] * p[i];
        sq += v2;
      }
    }
    m_sum[static_cast<size_t>(ch)] += static_cast<float>(s);
    m_sum_squares[static_cast<size_t>(ch)] += static_cast<float>(sq);
  }
  m_counter += nb * inner;
  m_tracked += 1;
  return m_tracked == chunks;
}

void DeferredBatchNormStats::commit(BatchNorm& bn) {
  // DeferredBatchNorm._commit: float32 tensors, Python-float factors applied as float32
  Buffer& nbt = bn.num_batches_tracked();
  nbt.i64 += 1;
  const std::optional<double> momentum = bn.options().momentum;
  const double m = momentum ? *momentum : 1.0 / static_cast<double>(nbt.i64);
  const float keep = static_cast<float>(1.0 - m), take = static_cast<float>(m);
  const float counter = static_cast<float>(m_counter);
  float* rm = bn.running_mean().value.ptr();
  float* rv = bn.running_var().value.ptr();
  for (size_t ch = 0; ch < m_sum.size(); ++ch) {
    const float mean = m_sum[ch] / counter;
    const float var = m_sum_squares[ch] / counter - mean * mean;
    rm[ch] *= keep;
    rm[ch] += mean * take;
    rv[ch] *= keep;
    rv[ch] += var * take;
  }
  std::fill(m_sum.begin(), m_sum.end(), 0.0f);
  std::fill(m_sum_squares.begin(), m_sum_squares.end(), 0.0f);
  m_counter = 0;
  m_tracked = 0;
}

}  // namespace lab
