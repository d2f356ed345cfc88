// RunConfig: every setting of a training run, with PyTorch's names. The resolved configuration is
// echoed as the first thing a run prints and written as config.toml into its run directory; a
// config.toml can be read back (the GUI opens run directories, lessons store configurations).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "device.h"

namespace lab {

constexpr int kConfigFormatVersion = 1;
constexpr int kMaxWorldSize = 64;
constexpr const char* kDtlabVersion = "0.1.0";

struct RunConfig {
  // model and data
  std::string model = "cnn";           // mlp | cnn
  std::string data_dir;                // empty: the Debian package's directory
  int64_t limit_train = 0;             // 0: all samples
  int64_t limit_test = 0;
  // distributed setup
  int world_size = 1;
  std::string comm = "threads";        // emulated ranks
  std::string bn = "local";            // local | sync
  bool broadcast_buffers = true;
  double bucket_cap_mb = 25.0;
  double timeout_s = 60.0;             // every blocking collective gives up after this
  // allreduce algorithm (ring_allreduce.h, naive_allreduce.h, tree_allreduce.h)
  std::string allreduce = "ring";      // ring | naive | tree | mpi (the transport's own: --comm mpi)
  // data loading (per rank)
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;              // DataLoader drop_last
  bool sampler_drop_last = false;      // DistributedSampler drop_last
  // schedule
  int64_t epochs = 1;
  int64_t steps = 0;                   // > 0: stop after this many iterations
  // optimization
  std::string optimizer = "sgd";       // sgd | adam | adamw (torch.optim.SGD, Adam, AdamW)
  double lr = 0.05;
  double momentum = 0.9;               // SGD's (0 for Adam and AdamW, which have none)
  double weight_decay = 0.0;           // SGD and Adam: L2 added to the gradient; AdamW: decoupled
  bool nesterov = false;
  double adam_beta1 = 0.9;             // Adam, AdamW: betas
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  // learning-rate schedule per epoch (lr_schedule.h): constant, cosine (CosineAnnealingLR with
  // T_max = lr_t_max, 0: the run's epochs, and eta_min = lr_min) or step (StepLR(lr_step_size,
  // lr_gamma)); the scheduler steps at the end of every epoch
  std::string lr_schedule = "constant";
  int64_t lr_t_max = 0;
  double lr_min = 0.0;
  int64_t lr_step_size = 1;
  double lr_gamma = 0.1;
  // BatchNorm
  std::optional<double> bn_momentum = 0.1;  // nullopt: cumulative average ("none")
  double bn_eps = 1e-5;
  bool track_running_stats = true;
  bool batchnorm = true;               // false: the model without its BatchNorm layers (--no-batchnorm)
  // reproducibility and resources
  uint64_t seed = 0;
  int threads = 0;                     // 0: one per core
  // where the model computes (--device) and its numerics switches (device.h, lab/nn/executor.h)
  ComputeOptions compute;
  // teaching aid: the gradient sums over the batch add their partial sums in an order drawn per
  // call (atomic adds over compute threads; the naive allreduce's gather in arrival order), as GPU
  // atomics do: two runs differ (parallel.h: arrival_order; config_effects.h says where it cannot)
  bool nondeterministic = false;
  // outputs
  std::string out_dir;                 // empty: no run directory
  bool overwrite = false;              // replace an earlier run in out_dir (an action, not in config.toml)
  std::string init;                    // safetensors file to start from
  int64_t trace_steps = 100;           // steps written to trace.json; -1: all
  std::string record_bn = "auto";      // BatchNorm statistics in bn_stats.bin: auto, all, off or every N-th step
  bool record_memory = false;          // metrics.jsonl: every step's memory points per rank (memory.h)
  // checkpoints (checkpoint.h): every N iterations (0: off) and/or at the start of every epoch;
  // resume: continue the run directory's newest committed checkpoint
  int64_t checkpoint_every = 0;
  bool checkpoint_every_epoch = false;
  std::string resume;
  int64_t eval_batch_size = 1000;
  // periodic evaluation of a copy of rank 0's model in both BatchNorm modes (the GUI's train vs
  // eval view): after every eval_every iterations (0: off), on the first eval_samples test samples
  int64_t eval_every = 0;
  int64_t eval_samples = 1000;
  // teaching / testing: make one rank fail at a given step
  int fail_rank = -1;
  int64_t fail_step = -1;
  std::string fail_at = "backward";    // forward | backward | allreduce | hang | nan
  // A loss or gradient that is NaN or infinite: stop (the run fails naming the rank, iteration and
  // layer, before the allreduce spreads it) or skip-step (as AMP's GradScaler: no optimizer step
  // where the averaged gradient is not finite; the run goes on and summary.json lists the steps).
  std::string on_nonfinite = "stop";

  // ---- parallelism modes and communication behaviour ([distributed] in config.toml) ----
  // mode: ddp (DistributedDataParallel), dp (nn.DataParallel: one process, world_size devices,
  // batch_size is the global batch), local-sgd (DDP with the post-localSGD hook and
  // PeriodicModelAverager: gradients allreduced for warmup_steps iterations, then parameters
  // averaged every average_every iterations), async (a parameter server; world_size workers push
  // gradients without waiting for each other: Hogwild!/A3C style), zero (DDP with
  // ZeroRedundancyOptimizer: ZeRO-1, the optimizer's state sharded by whole parameters), fsdp
  // (FullyShardedDataParallel: ZeRO-2/3 per sharding_strategy, flat parameters per fsdp_wrap unit).
  std::string mode = "ddp";
  int64_t average_every = 4;           // local-sgd: PeriodicModelAverager period
  int64_t warmup_steps = 0;            // local-sgd: iterations with per-step gradient allreduce first
  bool overlap = true;                 // ddp: bucket allreduces on the rank's comm thread during backward
  int64_t no_sync_steps = 0;           // ddp: K backward passes under no_sync before each synchronized one
  bool parameters_as_bucket_view = false;  // zero: ZeroRedundancyOptimizer broadcasts one bucket per rank
  std::string sharding_strategy = "full_shard";  // fsdp: full_shard | shard_grad_op | no_shard
  std::string fsdp_wrap = "model";               // fsdp: model (one unit) | layer (a unit per module)
  // --mode pipeline (pipeline.h): one rank per stage of the model; each mini-batch cut into
  // microbatches (torch.chunk), run by the schedule gpipe or 1f1b
  int stages = 0;                      // pipeline: stages (0: world_size; given, world_size follows it)
  int64_t microbatches = 4;            // pipeline: Pipe's chunks
  std::string schedule = "gpipe";      // pipeline: gpipe | 1f1b
  std::string balance;                 // pipeline: modules per stage, "2,3,2,1" (empty: automatic)
  bool deferred_batch_norm = false;    // pipeline: Pipe(deferred_batch_norm=True)
  int dp = 1;                          // pipeline: data-parallel replicas of the pipeline (world = stages x dp)
  // --mode tensor (tensor_parallel.h): Megatron-LM's column- and row-parallel layers over tp ranks
  int tp = 0;                          // tensor: ranks each split layer is cut over (0: world_size; given,
                                       // world_size follows it)
  double link_latency_us = 0;          // simulated link between emulated ranks: latency per message
  double link_gbps = 0;                // ... and bandwidth (0: unlimited); both 0: no simulated link
  // ... on nodes (link_model.h: Nodes): ranks per node, in order (0: one switch, no nodes; needs
  // link_gbps > 0 and a world size that is a multiple of it), each node's NICs' bandwidth (Gbit/s,
  // each direction; needed with nodes), the latency a message between nodes adds, and the NICs
  // per node (rank i of a node uses NIC i % K)
  int link_gpus_per_node = 0;
  double link_nic_gbps = 0;
  double link_nic_latency_us = 0;
  int link_nics_per_node = 1;
  // ... and the nodes on leaf switches (link_model.h: Leaves; needs link_gpus_per_node > 0): nodes
  // per leaf, in order (0: every node on one non-blocking switch; the last leaf may hold fewer),
  // and the oversubscription of each leaf's uplink (>= 1; it carries its NICs' bandwidth / this)
  int link_nodes_per_leaf = 0;
  double link_oversubscription = 1;
  bool uneven_data = false;            // rank r drops the last r batches of its shard every epoch
  bool join = false;                   // DDP join: ranks that ran out of data shadow the collectives
  // --mode async (async_ps.h): world_size workers and a parameter server that applies each
  // gradient as it arrives ("free"), or in an order drawn from async_seed ("seeded": reproducible)
  std::string async_schedule = "free";
  uint64_t async_seed = 0;

  bool link_model() const { return link_latency_us > 0 || link_gbps > 0; }
  // (Samples per iteration over all ranks depend on the mode: lab::global_batch, mode.h.)
};

// Validates values and combinations; throws ConfigError with PyTorch's wording where PyTorch has
// one (batch_size) and naming the flag otherwise. Refuses the settings that would have no effect
// where one is clearly expected (config_effects.h: --nondeterministic that reorders nothing,
// failure injection that cannot fire).
void validate(const RunConfig& cfg);
// --cuda-graphs (compute.cuda_graphs): throws ConfigError, naming the setting, where the captured
// step cannot apply: a mode other than ddp, several ranks, Adam or AdamW, SyncBN, BatchNorm's
// cumulative average, no_sync. validate() asks it; so does bench train.
void refuse_graphs_where_they_cannot_apply(const RunConfig& c);

// TOML text of the resolved configuration, with a header naming the format version, dtlab's
// version and the backends used.
std::string to_toml(const RunConfig& cfg, const std::vector<std::pair<std::string, std::string>>& backends);
// Reads a config.toml written by to_toml (unknown keys are an error naming the key and file).
// Validated, except for settings that had no effect (config_effects.h): a finished run opens.
RunConfig config_from_toml_file(const std::string& path);
// The same from text; `name` is what errors call it.
RunConfig config_from_toml(const std::string& text, const std::string& name);

// "local", "sync"; "none" or a number for bn_momentum.
std::string bn_momentum_str(const std::optional<double>& m);

}  // namespace lab
