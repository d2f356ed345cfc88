// Memory accounting: the bytes a rank holds, by category, at named points of a training step.
//
// What is counted is what torch.cuda.memory_allocated() counts in PyTorch: the bytes of the live
// tensors (a buffer's element count times its element size), not what the allocator keeps cached
// for reuse. dtlab's modules keep their scratch from one iteration to the next (an allocator's
// cache in all but name), so "activations" are counted from the train forward that saves them to
// the backward that consumes them, and FSDP really frees its gathered parameters and unsharded
// gradients (std::vector storage released) where PyTorch's FSDP frees them.
//
// Categories (the ZeRO paper's model states first, then what a step adds on top of them):
//   parameters           the parameters the rank keeps between steps (FSDP sharded: its shards)
//   gradients            gradients: the model's (DDP, ZeRO-1; FSDP while a unit's are unsharded)
//                        and FSDP's sharded ones
//   optimizer_state      momentum buffers, Adam's exp_avg and exp_avg_sq (ZeRO-1, FSDP: the owned
//                        parameters' or the shards' only)
//   activations          what the train forward saved for backward (module outputs and inputs,
//                        masks, argmax indices) and the loss's gradient
//   comm_buffers         DDP's gradient buckets, FSDP's padded flat parameter or gradient while a
//                        collective works on it, ZeRO's broadcast buckets
//   gathered_parameters  FSDP's all-gathered (unsharded) parameters while they are held
// Not counted: BatchNorm's running statistics (2C floats a layer), the data batch, the
// collectives' own segment buffers, and memory on a device (a CUDA executor's).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lab {

enum MemoryCategory : int {
  kMemParameters = 0,
  kMemGradients,
  kMemOptimizerState,
  kMemActivations,
  kMemCommBuffers,
  kMemGatheredParameters,
  kMemCategories
};

// "parameters", "gradients", "optimizer_state", "activations", "comm_buffers", "gathered_parameters"
const char* memory_category_name(int category);
// "params", "grads", "optimizer", "activations", "comm", "gathered": the app's short labels
const char* memory_category_short(int category);

struct MemoryBytes {
  int64_t bytes[kMemCategories] = {};
  int64_t& operator[](int c) { return bytes[c]; }
  int64_t operator[](int c) const { return bytes[c]; }
  int64_t total() const;
  // parameters + gradients + optimizer state: the ZeRO paper's "model states"
  int64_t model_states() const { return bytes[kMemParameters] + bytes[kMemGradients] + bytes[kMemOptimizerState]; }
};

// One point of a step: "forward", "backward: all-gather 4", ...
struct MemorySample {
  std::string point;
  MemoryBytes bytes;
};

// The step of a run whose points reached the highest total, and those points.
struct MemoryPeak {
  int64_t step = -1;                  // -1: none yet
  size_t point = 0;                   // the highest of `points` (the first on a tie)
  std::vector<MemorySample> points;
  bool empty() const { return step < 0; }
  const MemorySample& top() const { return points[point]; }
  // Keeps step's points when their highest total is above the peak's (an earlier step stays on a tie).
  void offer(int64_t step, const std::vector<MemorySample>& pts);
};

// A rank's ledger: the points of the step in progress, the last step's, and the run's peak.
// measure() is the rank's mode's accounting (RankMode::measure_memory over the model and the
// optimizer); sample() records it at a point. One rank thread uses a ledger.
class MemoryLedger {
 public:
  void set_measure(std::function<MemoryBytes()> measure) { m_measure = std::move(measure); }
  // A new step: its points start empty.
  void begin_step(int64_t step);
  // Records the bytes at `point` of the step in progress (no-op without a measure).
  void sample(const std::string& point);
  // The step in progress's points, in order.
  const std::vector<MemorySample>& points() const { return m_points; }
  // The run's highest total so far, its step and point (peak_step -1: none yet).
  const MemorySample& peak() const { return m_peak.empty() ? m_last : m_peak.top(); }
  int64_t peak_step() const { return m_peak.step; }
  // The last point recorded (the end of the last step).
  const MemorySample& last() const { return m_last; }

 private:
  std::function<MemoryBytes()> m_measure;
  std::vector<MemorySample> m_points;
  int64_t m_step = -1;
  MemoryPeak m_peak;
  MemorySample m_last;
};

// The ZeRO paper's model states per rank in dtlab's fp32 (parameters 4 bytes an element,
// gradients 4, optimizer K: 0 SGD, 4 momentum, 8 Adam), Psi parameters, N ranks:
//   stage 0 (DDP)                  params 4 Psi      grads 4 Psi      optimizer K Psi
//   stage 1 (ZeroRedundancyOpt.)   params 4 Psi      grads 4 Psi      optimizer K Psi / N
//   stage 2 (shard_grad_op)        params 4 Psi      grads 4 Psi / N  optimizer K Psi / N
//   stage 3 (full_shard)           params 4 Psi / N  grads 4 Psi / N  optimizer K Psi / N
// (divisions rounded up). Stage 2's whole parameters are the paper's: FSDP's SHARD_GRAD_OP holds
// them gathered from the forward's all-gather to the end of backward and keeps only its shard in
// between steps, so dtlab measures them as gathered_parameters during the step.
struct ZeroFormula {
  int stage = 0;          // 0..3
  int64_t psi = 0;        // parameters (elements)
  int k = 0;              // optimizer bytes per parameter
  int world = 1;
  MemoryBytes model_states() const;  // parameters, gradients, optimizer state; the rest 0
  // "(8+K)Psi", "8Psi + K Psi/N", "4Psi + (4+K)Psi/N", "(8+K)Psi/N": the paper's expression
  std::string expression() const;
};

// K of an optimizer: 0 (SGD without momentum), 4 (SGD with momentum), 8 (Adam, AdamW).
int optimizer_bytes_per_parameter(bool adam, double momentum);

}  // namespace lab
