// One rank of DistributedDataParallel (mode_ddp.cpp), and what local SGD (mode_local_sgd.cpp)
// changes of it: DDP's iteration with its buckets (ddp.h), overlap, no_sync, join (join.h), the
// buffer broadcast and skip-step; local SGD allreduces gradients only during its warm-up and
// averages parameters after the optimizer step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddp.h"
#include "join.h"
#include "mode.h"
#include "sampler.h"
#include "tensor.h"

namespace lab {

class DdpRank : public RankMode {
 public:
  explicit DdpRank(RankEnv& env);
  void start() override;
  std::vector<std::vector<int64_t>> batches(int64_t epoch) override;
  int64_t samples_per_epoch() const override { return m_sampler.num_samples(); }
  void before_step(const StepInput& in) override;
  StepCount step(const StepInput& in, StepRecord& rec) override;
  void after_batches(int64_t epoch, int64_t& step, int64_t batches_done) override;
  void before_evaluation() override;
  void save(ModeCheckpoint& mc) const override;
  void restore(const ModeCheckpoint& mc, int64_t epochs_done) override;
  // the gradient buckets (DDP allocates them at the first backward and keeps them)
  void measure_memory(MemoryBytes& b) const override { b[kMemCommBuffers] += m_reducer.bucket_bytes(); }

 protected:
  // Whether iteration `step`'s backward allreduces gradients (a synchronized step of several ranks).
  virtual bool allreduces(int64_t step) const { (void)step; return true; }
  // After the optimizer step: local SGD averages parameters; returns the drift before averaging
  // (-1: none).
  virtual double after_optimizer_step() { return -1.0; }

  RankEnv& m_env;
  DdpReducer m_reducer;
  DdpJoin m_join;
  DistributedSampler m_sampler;
  int64_t m_batches_per_epoch = 0;     // the steps of a full epoch (uneven data: before the cut)
  bool m_require_forward_param_sync = true;  // DDP: sync buffers before the next forward
  const bool m_broadcast_once;         // a lesson's mutation test (mutation.h)
  const bool m_broadcast;              // broadcast_buffers (or the mutation that ignores the flag)
  // lessons' mutation tests (mutation.h): each the one place its wrong behaviour lives
  const bool m_eval_no_broadcast, m_no_sync_allreduces, m_no_sync_broadcasts, m_grad_overwrites,
      m_bn_update_on_sync_only;
  std::vector<std::string> m_pnames;   // parameter names, for a non-finite gradient's message
  const bool m_graphs;                 // --cuda-graphs: the whole step in one call (Model::graph_step)
  StepCount graph_step(const StepInput& in, StepRecord& rec);
};

// A step's record (the whole batch trained) and its count, as DDP and the modes built like it
// (local SGD, ZeRO, FSDP) fill it: drift -1 where the mode has none, synced false under no_sync.
StepCount record_step(const StepInput& in, StepRecord& rec, float loss, int correct, double drift, bool synced,
                      bool skipped, const std::string& nonfinite);

// summary.json's "ddp": the gradient buckets of the last step (several ranks).
void ddp_summary(const SummaryEnv& env, nlohmann::json& j);

}  // namespace lab
