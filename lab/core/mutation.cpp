#include "mutation.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "errors.h"

namespace lab {

const std::vector<MutationInfo>& known_mutations() {
  static const std::vector<MutationInfo> k = {
      {"ddp-broadcast-once",
       "DDP broadcasts rank 0's buffers at construction only, not before every training forward "
       "(broadcast_buffers then changes nothing during training)"},
      {"link-per-pair",
       "the simulated network gives every ordered pair of ranks a link of its own instead of one link per rank "
       "to a switch: a rank's messages to different ranks leave at the same time, so sending to N-1 ranks costs "
       "one message time"},
      {"sim-no-latency",
       "dtlab simulate charges no latency (no base latency, no per-hop or per-message latency): only bytes over "
       "bandwidth, as the bandwidth-only formulas of most teaching tools, which predict no slowdown as N grows"},
      {"naive-relay",
       "the naive allreduce's rank 0 sends the sum to rank 1 only, and each rank passes it on to the next: rank 0 "
       "sends S instead of (N-1) S (the same sum, the same bits)"},
      {"dp-replicate-chain",
       "DataParallel's replicate passes the parameters and buffers from device to device (0 -> 1 -> 2 ...) "
       "instead of device 0 sending a copy to every device: device 0 is no longer at one end of every transfer"},
      {"async-no-interleaving",
       "the parameter server serves a worker that pulled again until it has pushed: no other push comes between a "
       "worker's pull and its push, so no gradient is ever stale"},
      {"async-take-turns",
       "the seeded parameter server serves the workers in turn, each worker's push followed by its next pull: "
       "the N-1 other workers push between any worker's pull and its push (staleness N-1 once under way)"},
      {"ddp-launch-after-backward",
       "DDP with overlap on launches every bucket's allreduce after the whole backward, as --no-overlap does"},
      {"ddp-no-overlap-in-hook",
       "DDP with --no-overlap launches each bucket's allreduce inside backward, on the backward thread, as soon "
       "as the bucket is ready (InHook) instead of after backward"},
      {"ddp-launch-unfinished-bucket",
       "DDP with overlap launches a bucket's allreduce at the first of its gradients to be ready, reducing the "
       "others before backward has computed them"},
      {"naive-drops-last-rank",
       "the naive allreduce's rank 0 receives the last rank's buffer but leaves it out of the sum"},
      {"bench-busbw-own-traffic",
       "dtlab bench allreduce reports naive's busbw from its rank 0's traffic, algbw x 2(N-1), instead of "
       "nccl-tests' algbw x 2(N-1)/N for every algorithm"},
      {"ddp-eval-no-broadcast",
       "the first forward after training (the end-of-epoch evaluation) does not broadcast rank 0's buffers, "
       "although DDP's forward does whenever the forward before it was a synchronized training forward"},
      {"ddp-broadcast-ignores-flag",
       "DDP broadcasts rank 0's buffers before forwards even with --no-broadcast-buffers (broadcast_buffers=False)"},
      {"syncbn-local-stats",
       "SyncBatchNorm exchanges nothing: every rank normalizes with its own batch's statistics, like ordinary "
       "BatchNorm (no all-gather of mean, variance and count, no allreduce in backward)"},
      {"bn-allow-one-value",
       "BatchNorm trains on one value per channel instead of refusing it (PyTorch's size check left out: the "
       "output is the bias alone and running_var takes 0 / 0)"},
      {"bn-refuses-batch-of-one",
       "BatchNorm refuses every batch of one sample (N = 1), where PyTorch refuses only one value per channel "
       "(N x H x W = 1)"},
      {"ddp-no-sync-allreduces",
       "DDP allreduces the gradient in every backward, under no_sync too (no_sync only postpones the optimizer step)"},
      {"ddp-no-sync-broadcasts",
       "DDP broadcasts rank 0's buffers before every training forward, also after a forward under no_sync"},
      {"grad-accumulation-overwrites",
       "every backward overwrites .grad instead of adding into it: no_sync accumulates nothing, the synchronized "
       "step uses the last micro-batch's gradient alone"},
      {"bn-updates-on-sync-only",
       "BatchNorm's running statistics (and num_batches_tracked) are updated only in synchronized forwards, not "
       "under DDP's no_sync"},
      {"checkpoint-drops-momentum",
       "a resumed run restores the parameters and buffers but not SGD's momentum buffers (a fresh optimizer)"},
      {"pipeline-whole-batch",
       "--mode pipeline does not cut the mini-batch: every stage runs one forward and one backward of the whole "
       "batch, whatever --microbatches says"},
      {"pipeline-1f1b-is-gpipe", "--schedule 1f1b runs GPipe's order: every forward, then every backward"},
      {"pipeline-deferred-bn-ignored",
       "--deferred-batch-norm has no effect: the running statistics move with every micro-batch's statistics"},
      {"fsdp-keeps-gathered",
       "FSDP never frees the parameters it all-gathers: every rank holds the whole model between iterations, "
       "as DDP does, beside its shards"},
      {"fsdp-no-sync-reduces",
       "FSDP reduce-scatters (or allreduces) every unit's gradient under no_sync too, as if no_sync only "
       "postponed the optimizer step: the unsharded gradients are freed after every backward"},
      {"memory-skips-optimizer-state",
       "the memory accounting leaves the optimizer's state out (momentum, Adam's moments count 0 bytes)"},
      {"zero-partition-unsorted",
       "ZeroRedundancyOptimizer's partition takes the parameters in registration order instead of largest first "
       "(each still to the rank with the fewest elements so far)"},
      {"zero-skips-sync",
       "ZeroRedundancyOptimizer steps each rank's own parameters but never broadcasts them: every rank keeps "
       "the others' parameters at their initial values"},
      {"local-sgd-keeps-own-params",
       "PeriodicModelAverager allreduces the parameters but every rank keeps its own: the replicas never meet"},
      {"local-sgd-averages-late",
       "PeriodicModelAverager averages after iterations K - 1, 2K - 1, ... instead of 0, K, 2K, ... "
       "(step >= warmup_steps and (step - warmup_steps) % period == 0)"},
      {"bn-eval-uses-batch-stats",
       "BatchNorm in eval mode normalizes with the batch's statistics instead of running_mean and running_var "
       "(model.eval() changes nothing for BatchNorm)"},
      {"bn-untracked-eval-uses-init-stats",
       "BatchNorm with track_running_stats=False normalizes in eval mode with mean 0 and variance 1 (the initial "
       "running statistics) instead of the batch's"},
      {"eval-train-mode-as-eval",
       "an evaluation in train mode (model.train() at test time) runs the model in eval mode: the mode is ignored"},
      {"loader-drops-last-always", "the DataLoader drops the short last batch even with drop_last=False"},
      {"sampler-no-sharding",
       "DistributedSampler gives every rank the whole dataset (as if num_replicas were 1): no sharding"},
      {"sampler-drop-last-inverted",
       "DistributedSampler reads its drop_last the wrong way round: it cuts the dataset by default and pads it "
       "with drop_last=True"},
      {"autocast-ignored",
       "Model::set_autocast keeps the float32 model: `dtlab eval --autocast bf16` evaluates float32 twice"},
      {"autocast-coarse-activations",
       "under autocast the activations between layers (BatchNorm, ReLU, pooling outputs) are rounded to 3 "
       "significant bits instead of bfloat16's 8"},
      {"sgemm-row-by-row",
       "sgemm computes C one row at a time (M products of one row): no reuse of op(B) across the rows, as "
       "if a framework looped over the samples of a batch"},
      {"per-sample-sum",
       "bench train --per-sample adds the single samples' gradients without the 1/B of the batch's mean loss"},
      {"nondeterministic-ignored",
       "--nondeterministic does not switch the layers to arrival-order sums: the fixed order stays"},
      {"gemm-one-thread",
       "sgemm ignores the thread count it is given and computes every product on one thread "
       "(gemm_set_threads: a product no longer uses the cores it may)"},
      {"chain-dp-costliest",
       "the matrix-chain dynamic program keeps the costliest split instead of the cheapest "
       "(bench chain's \"optimal\" order is then the most expensive one)"},
  };
  return k;
}

std::vector<std::string> active_mutations() {
  std::vector<std::string> out;
  const char* env = std::getenv("DTLAB_MUTATE");
  if (!env || !*env) return out;
  const std::string list = env;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = list.find(',', at);
    const std::string name = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    at = comma == std::string::npos ? list.size() + 1 : comma + 1;
    if (name.empty()) continue;
    const auto& known = known_mutations();
    if (std::none_of(known.begin(), known.end(), [&](const MutationInfo& m) { return name == m.name; })) {
      std::string names;
      for (const MutationInfo& m : known) names += (names.empty() ? "" : ", ") + std::string(m.name);
      throw ConfigError("DTLAB_MUTATE: unknown mutation '" + name + "'", "known: " + names);
    }
    out.push_back(name);
  }
  return out;
}

bool mutated(const char* name) {
  const char* env = std::getenv("DTLAB_MUTATE");
  if (!env || !*env) return false;  // the usual case: one getenv
  const std::vector<std::string> on = active_mutations();
  return std::find(on.begin(), on.end(), std::string(name)) != on.end();
}

}  // namespace lab
