// --mode dp: nn.DataParallel (data_parallel.h for its mechanics). One process, world_size devices
// (emulated as the run's rank threads), one DataLoader of global batches: every iteration, device
// 0 scatters the batch like torch.chunk, replicates its module, gathers the outputs, computes the
// loss and sums every replica's gradient before its optimizer step. Device 0's step record holds
// the global batch's loss and accuracy and the chunk sizes; every working device its own
// replica's BatchNorm statistics and chunk size.
#include <numeric>

#include "data_parallel.h"
#include "errors.h"
#include "mode.h"
#include "run.h"

namespace lab {

namespace {

class DpRank : public RankMode {
 public:
  explicit DpRank(RankEnv& env)
      : m_env(env),
        m_device(env.model, env.comm, env.opt),
        m_loader(env.train.size, env.cfg.batch_size, env.cfg.shuffle, env.cfg.drop_last, env.cfg.seed) {}

  // DataParallel replicates at every forward: no initial broadcast (start() does nothing).
  std::vector<std::vector<int64_t>> batches(int64_t epoch) override {
    (void)epoch;  // one DataLoader over the whole training set, global batches
    return m_loader.next_epoch();
  }
  int64_t samples_per_epoch() const override { return m_env.train.size; }

  StepCount step(const StepInput& in, StepRecord& rec) override {
    const int64_t n = static_cast<int64_t>(in.indices->size());
    const DpStepResult r = m_device.train_step(
        *in.x, *in.labels, n, "batch " + std::to_string(in.batch) + " of epoch " + std::to_string(in.epoch),
        [&] { m_env.faults.check(m_env.rank, in.step, "backward"); });
    const bool device0 = m_env.rank == 0;
    const int64_t global = std::accumulate(r.chunks.begin(), r.chunks.end(), int64_t{0});
    rec.batch_size = device0 ? global : r.my_chunk;  // 0: idle this iteration (fewer chunks than devices)
    rec.loss = r.loss;
    rec.correct = r.correct;
    if (device0) rec.chunks = r.chunks;
    StepCount count;
    count.counts = device0;  // the epoch's train loss and accuracy come from device 0 alone
    count.samples = device0 ? global : 0;
    count.trained = device0 ? global : 0;
    count.record_bn = r.my_chunk > 0;
    return count;
  }
  // The evaluation forward's replicas (device 0 holds the module itself).
  void before_evaluation() override { m_device.replicate_all(); }
  // The loader's generator as after `epochs_done` epochs (the order is a function of the seed).
  void restore(const ModeCheckpoint& mc, int64_t epochs_done) override {
    (void)mc;
    for (int64_t e = 0; e < epochs_done; ++e) m_loader.next_epoch();
  }

 private:
  RankEnv& m_env;
  DataParallelDevice m_device;
  SingleProcessLoader m_loader;
};

class DpMode : public ParallelMode {
 public:
  const char* name() const override { return "dp"; }
  const char* title() const override { return "nn.DataParallel"; }
  const char* help() const override { return "nn.DataParallel (one process, world_size devices)"; }
  const char* about() const override {
    return "nn.DataParallel: one process drives world_size devices. batch_size is the global batch, split over the "
           "devices like torch.chunk; device 0 scatters the inputs, copies its parameters and buffers to every "
           "device each iteration, gathers the outputs, computes the loss and receives every gradient. Every byte "
           "passes through device 0.";
  }
  ModeCaps caps() const override {
    ModeCaps k;
    k.checkpoints = k.threads_only = k.global_batch = k.master_device = k.counts_trained_samples = true;
    k.distributed_sampler = false;
    k.replicas_are_models = false;  // devices other than 0 hold last iteration's replicas
    return k;
  }
  void validate(const RunConfig& c) const override {
    if (c.comm != "threads")
      throw ConfigError("--mode dp is torch.nn.DataParallel: one process driving all its devices",
                        "run it with --comm threads (the default); for ranks as processes use --mode ddp");
    if (c.bn == "sync")
      throw ConfigError("SyncBatchNorm is only supported within torch.nn.parallel.DistributedDataParallel",
                        "--mode dp normalizes each replica's chunk on its own; use --mode ddp --bn sync");
    if (c.sampler_drop_last)
      throw ConfigError("--sampler-drop-last has no effect with --mode dp",
                        "DataParallel has one DataLoader and no DistributedSampler; --drop-last drops its last batch");
    if (c.fail_at == "allreduce" && c.fail_rank >= 0)
      throw ConfigError("--fail-at allreduce: --mode dp has no gradient allreduce",
                        "choose --fail-at forward, backward or hang");
    if (c.uneven_data || c.join)
      throw ConfigError("--uneven-data and --join apply to --mode ddp",
                        "DataParallel has a single data loader: every step uses every device");
  }
  std::string no_effect_reason(const RunConfig& c, const std::string& setting) const override {
    (void)c;
    if (setting == "overlap" || setting == "bucket_cap_mb")
      return "DataParallel has no gradient buckets: device 0 reduces the gradients after backward";
    if (setting == "allreduce")
      return "DataParallel has no allreduce: every device sends its gradients to device 0, which adds them in device "
             "order (reduce)";
    if (setting == "broadcast_buffers")
      return "DataParallel copies device 0's parameters and buffers to every device at every forward (replicate): "
             "broadcast_buffers is DDP's";
    return "";
  }
  std::string describe(const RunConfig& c) const override {
    return "DataParallel, " + std::to_string(c.world_size) + (c.world_size == 1 ? " device" : " devices");
  }
  const char* member() const override { return "device"; }
  SyncCollectives sync_collectives() const override { return {"reduce", {"gradients"}}; }
  std::string header(const RunConfig& c) const override {
    return " (one process, " + std::to_string(c.world_size) + " devices, global batch " + std::to_string(c.batch_size) +
           ")";
  }
  std::unique_ptr<RankMode> make_rank(RankEnv& env) const override { return std::make_unique<DpRank>(env); }
  void summary(const SummaryEnv& env, nlohmann::json& j) const override {
    const TrafficStats& tr = env.summary.traffic;
    j["data_parallel"] = {{"devices", env.cfg.world_size}, {"global_batch", env.cfg.batch_size},
                          {"device0_share_of_bytes", tr.rank0_share},
                          {"device0_bytes", tr.bytes_moved ? tr.sent[0] + tr.received[0] : 0}};
  }
};

}  // namespace

std::unique_ptr<ParallelMode> make_dp_mode() { return std::make_unique<DpMode>(); }

}  // namespace lab
