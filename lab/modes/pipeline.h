// Pipeline parallelism's mechanisms (--mode pipeline, mode_pipeline.cpp), each testable alone:
//   stages     the model cut at module boundaries into P contiguous stages, one per rank
//              (torchgpipe's `balance`: modules per stage);
//   schedules  the order in which one stage runs the forwards and backwards of M micro-batches:
//              GPipe (Huang et al., 2019: every forward, then every backward in reverse order) and
//              1F1B (PipeDream-Flush, Narayanan et al., 2021: after p - s - 1 warm-up forwards, one
//              forward and one backward alternate; Megatron-LM's schedule without interleaving);
//   timeline   the schedule played with fixed block costs and no communication cost: its bubble (the
//              idle share of P stages x the step) is (p-1)/(m+p-1) for both schedules with equal
//              stages; what 1F1B shrinks is the number of micro-batches in flight (min(p-s, m) on
//              stage s instead of m), and with it the activations held;
//   deferred BatchNorm  torch.distributed.pipeline.sync's DeferredBatchNorm: each micro-batch is
//              normalized with its own statistics, their sums are tracked, and the running
//              statistics are updated once per `chunks` micro-batches with the biased variance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor.h"

namespace lab {

class Model;
class BatchNorm;

// ---- stages ----
struct PipelineStage {
  size_t begin = 0, end = 0;  // modules [begin, end)
};

// The stages of `model` for --stages P. balance (modules per stage, "2,3,2,1"; empty: automatic)
// must add up to the model's module count with no stage empty; automatic cuts before modules
// with matrix products (Linear, Conv2d) only, choosing the cuts that minimize the largest stage's
// forward multiply-adds. Throws ConfigError naming --stages or --balance and the model's layers.
std::vector<PipelineStage> pipeline_stages(Model& model, int stages, const std::string& balance,
                                           const std::string& model_name);
// "2,3,2,1": the stages' module counts (config.toml's balance).
std::string balance_text(const std::vector<PipelineStage>& stages);
// "0: Flatten, Linear(784, 256) | 1: BatchNorm1d(256), ReLU, ... ": the stage map, for the header.
std::string stage_map_text(Model& model, const std::vector<PipelineStage>& stages);

// ---- schedules ----
enum class PipeOp : uint8_t { Forward, Backward };
struct PipeStep {
  PipeOp op = PipeOp::Forward;
  int micro = 0;
  bool operator==(const PipeStep& o) const { return op == o.op && micro == o.micro; }
};
// "gpipe" or "1f1b"; throws ConfigError naming --schedule otherwise.
void check_schedule_name(const std::string& schedule);
// Stage `stage` of `stages`: its forwards and backwards of `micro` micro-batches, in order.
std::vector<PipeStep> pipeline_schedule(const std::string& schedule, int stages, int stage, int micro);
// The most micro-batches a stage holds between their forward and their backward under a schedule.
int peak_in_flight(const std::vector<PipeStep>& schedule);

// ---- the timeline of a schedule ----
struct PipeBlock {
  int stage = 0;
  PipeOp op = PipeOp::Forward;
  int micro = 0;
  double start = 0, end = 0;
};
struct PipeTimeline {
  std::vector<PipeBlock> blocks;     // every stage's, in each stage's order
  double makespan = 0;               // from the first block's start to the last block's end
  double bubble = 0;                 // idle share: 1 - busy / (stages x makespan)
  std::vector<int> peak_in_flight;   // per stage
};
// Every stage plays its schedule; a forward waits for the previous stage's forward of its
// micro-batch, a backward for the next stage's backward (the last stage's: its own forward).
// forward_cost and backward_cost: one block's time on every stage (or per stage, when given).
PipeTimeline simulate_pipeline(const std::string& schedule, int stages, int micro, double forward_cost,
                               double backward_cost);
PipeTimeline simulate_pipeline(const std::string& schedule, int stages, int micro,
                               const std::vector<double>& forward_cost, const std::vector<double>& backward_cost);
// The same for each stage's own order of blocks (orders[s]: stage s's, e.g. as a run recorded them).
// Throws Error when the orders deadlock (a forward waiting for one that never runs).
PipeTimeline simulate_orders(const std::vector<std::vector<PipeStep>>& orders, const std::vector<double>& forward_cost,
                             const std::vector<double>& backward_cost);
// GPipe's bubble, (p - 1) / (m + p - 1).
double bubble_formula(int stages, int micro);
// The measured bubble of one iteration from each stage's busy time (seconds of its forward and
// backward blocks) and the iteration's span over every stage (first block's start to last's end).
double measured_bubble(const std::vector<double>& busy, double span);

// ---- deferred BatchNorm ----
// One BatchNorm's deferred tracking (DeferredBatchNorm's sum, sum_squares, counter, tracked):
// track() after each micro-batch's forward with the BatchNorm's input; once `chunks` micro-batches
// are tracked (the configured number: a mini-batch cut into fewer chunks carries its sums over into
// the next one, as PyTorch's does), commit() updates bn's running statistics with the mean and the
// biased variance of everything tracked, num_batches_tracked + 1.
class DeferredBatchNormStats {
 public:
  // Adds x's per-channel sums (x: (N, C) or (N, C, H, W)); returns true when `chunks` are tracked.
  bool track(const Tensor& x, int chunks);
  void commit(BatchNorm& bn);
  int tracked() const { return m_tracked; }
  int64_t counter() const { return m_counter; }
  const std::vector<float>& sum() const { return m_sum; }
  const std::vector<float>& sum_squares() const { return m_sum_squares; }
  // A checkpoint's sums and counts, as they were (an empty sum: nothing tracked yet).
  void restore(std::vector<float> sum, std::vector<float> sum_squares, int64_t counter, int tracked) {
    m_sum = std::move(sum), m_sum_squares = std::move(sum_squares), m_counter = counter, m_tracked = tracked;
  }

 private:
  std::vector<float> m_sum, m_sum_squares;
  int64_t m_counter = 0;
  int m_tracked = 0;
};

}  // namespace lab
