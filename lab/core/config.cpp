#include "config.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config_effects.h"
#include "errors.h"
#include "mode.h"  // the modes' own checks are part of a configuration's validation
#include "toml_parse.h"

namespace lab {

std::string bn_momentum_str(const std::optional<double>& m) {
  if (!m) return "none";
  std::ostringstream s;
  s << *m;
  return s.str();
}

namespace {

// A number as the user typed it: -1, 0.05, 1e-05 (not std::to_string's -1.000000).
std::string num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// --link-gpus-per-node, the NIC flags (link_model.h: Nodes) and the leaf flags (link_model.h:
// Leaves) refine the simulated link: each is refused, by name, without it (--link-gbps: the links
// within a node) or without the nodes; --link-oversubscription also without the leaves.
// lab::check_link_model_options says the same of a LinkModelOptions; here in the flags' words.
// A node count that is not a multiple of --link-nodes-per-leaf is accepted (the last leaf holds
// fewer nodes), as the simulator's topologies accept it (lab/sim/topology.h): a partly filled last
// leaf is how clusters are built, and the model is well defined for it.
void validate_link_nodes(const RunConfig& c) {
  const RunConfig d;
  std::string given;  // the first node flag given, as typed
  if (c.link_gpus_per_node != d.link_gpus_per_node) given = "--link-gpus-per-node " + std::to_string(c.link_gpus_per_node);
  else if (c.link_nic_gbps != d.link_nic_gbps) given = "--link-nic-gbps " + num(c.link_nic_gbps);
  else if (c.link_nic_latency_us != d.link_nic_latency_us) given = "--link-nic-latency-us " + num(c.link_nic_latency_us);
  else if (c.link_nics_per_node != d.link_nics_per_node) given = "--link-nics-per-node " + std::to_string(c.link_nics_per_node);
  else if (c.link_nodes_per_leaf != d.link_nodes_per_leaf) given = "--link-nodes-per-leaf " + std::to_string(c.link_nodes_per_leaf);
  else if (c.link_oversubscription != d.link_oversubscription) given = "--link-oversubscription " + num(c.link_oversubscription);
  if (given.empty()) return;
  if (c.link_gpus_per_node < 0)
    throw ConfigError("--link-gpus-per-node must be >= 0 (0: no nodes), got " + std::to_string(c.link_gpus_per_node));
  if (!(c.link_nic_gbps >= 0) || !std::isfinite(c.link_nic_gbps))
    throw ConfigError("--link-nic-gbps must be > 0 (gigabits per second, each node's NIC), got " + num(c.link_nic_gbps));
  if (!(c.link_nic_latency_us >= 0) || !std::isfinite(c.link_nic_latency_us))
    throw ConfigError("--link-nic-latency-us must be >= 0 (microseconds), got " + num(c.link_nic_latency_us));
  if (c.link_nodes_per_leaf < 0)
    throw ConfigError("--link-nodes-per-leaf must be >= 0 (0: every node on one switch), got " +
                      std::to_string(c.link_nodes_per_leaf));
  if (!(c.link_oversubscription >= 1) || !std::isfinite(c.link_oversubscription))
    throw ConfigError("--link-oversubscription must be >= 1 (1: each leaf's uplink carries all its NICs' bandwidth), got " +
                          num(c.link_oversubscription),
                      "a leaf's uplink carries --link-nodes-per-leaf x --link-nics-per-node x --link-nic-gbps / X");
  if (!(c.link_gbps > 0))
    throw ConfigError(given + ": the nodes are part of the simulated link, which needs --link-gbps (the bandwidth of "
                              "each rank's link within a node)" +
                          std::string(c.link_model() ? "; --link-gbps is 0 (unlimited)" : "; the simulated link is off"),
                      "add --link-gbps G (e.g. 100 within a node), or drop " + given);
  if (c.link_gpus_per_node == 0)
    throw ConfigError(given + (given.rfind("--link-nic", 0) == 0 ? " describes the nodes' NICs"
                                                                 : " describes the leaf switches between the nodes") +
                          ": it needs --link-gpus-per-node N (the ranks of each node)",
                      "add --link-gpus-per-node N, or drop " + given);
  const std::string g = "--link-gpus-per-node " + std::to_string(c.link_gpus_per_node);
  if (!(c.link_nic_gbps > 0))
    throw ConfigError(g + " needs --link-nic-gbps > 0: the bandwidth of each node's NIC, each direction",
                      "e.g. --link-nic-gbps 100");
  if (c.link_nics_per_node < 1 || c.link_nics_per_node > c.link_gpus_per_node)
    throw ConfigError("--link-nics-per-node must be between 1 and " + std::to_string(c.link_gpus_per_node) + " (" + g +
                          "), got " + std::to_string(c.link_nics_per_node),
                      "rank i of a node uses its NIC i % K: a NIC beyond the node's ranks would carry nothing");
  if (c.world_size % c.link_gpus_per_node != 0)
    throw ConfigError(g + ": --world-size " + std::to_string(c.world_size) + " is not a multiple of " +
                          std::to_string(c.link_gpus_per_node) + " (ranks are placed on nodes of " +
                          std::to_string(c.link_gpus_per_node) + ", in order)",
                      "choose a --link-gpus-per-node that divides the world size");
  if (c.link_nodes_per_leaf == 0 && c.link_oversubscription != d.link_oversubscription)
    throw ConfigError("--link-oversubscription " + num(c.link_oversubscription) +
                          " describes the leaves' uplinks: it needs --link-nodes-per-leaf M (the nodes of each leaf switch)",
                      "add --link-nodes-per-leaf M, or drop --link-oversubscription");
  if (mode_of(c).caps().parameter_server)
    throw ConfigError(g + " with --mode " + c.mode + ": the parameter server beside the ranks has no node in the model",
                      "drop the --link-gpus-per-node, --link-nic-*, --link-nodes-per-leaf and --link-oversubscription "
                      "flags: the single switch still models --mode " + c.mode);
}

// --mode and the communication flags, and which combinations PyTorch itself supports: the modes'
// own checks (lab/modes/mode.h: every mode's settings, then the chosen mode's combinations in its
// own words), then what the chosen mode cannot do, by capability.
void validate_modes(const RunConfig& c) {
  const ParallelMode& mode = mode_of(c);
  for (const ParallelMode* m : modes()) m->validate_settings(c);
  if (c.no_sync_steps < 0) throw ConfigError("--no-sync-steps must be >= 0, got " + std::to_string(c.no_sync_steps));
  mode.validate(c);
  const ModeCaps caps = mode.caps();
  const std::string as = "--mode " + c.mode;
  if (c.no_sync_steps > 0 && !caps.no_sync)
    throw ConfigError("--no-sync-steps applies to --mode " + modes_with(&ModeCaps::no_sync) +
                      " (DistributedDataParallel.no_sync)");
  if (c.comm != "threads" && caps.threads_only)
    throw ConfigError(as + " runs every rank in this process", "use --comm threads (the default)");
  if (c.bn == "sync" && !caps.sync_bn)
    throw ConfigError("--bn sync: " + as + " has no SyncBatchNorm (modes with it: " + modes_with(&ModeCaps::sync_bn) + ")");
  if ((c.uneven_data || c.join) && !caps.uneven_data)
    throw ConfigError("--uneven-data and --join apply to --mode " + modes_with(&ModeCaps::uneven_data));
  if (c.fail_rank >= 0 && c.fail_at == "allreduce" && !caps.fail_at_allreduce)
    throw ConfigError("--fail-at allreduce: " + as + " has no gradient allreduce", "choose --fail-at forward, backward or hang");
  if (!(c.link_latency_us >= 0) || !std::isfinite(c.link_latency_us))
    throw ConfigError("--link-latency-us must be >= 0 (microseconds)");
  if (!(c.link_gbps >= 0) || !std::isfinite(c.link_gbps))
    throw ConfigError("--link-gbps must be >= 0 (gigabits per second; 0: unlimited)");
  if (c.link_model() && c.comm != "threads")
    throw ConfigError("--link-latency-us/--link-gbps simulate links between emulated ranks",
                      "use --comm threads, or measure the real network of the other transports");
  validate_link_nodes(c);
}

}  // namespace

namespace {

// validate() but for the settings that would have no effect (config_effects.h).
void validate_values(const RunConfig& c) {
  if (c.model != "mlp" && c.model != "cnn")
    throw ConfigError("--model: unknown model '" + c.model + "'", "choose mlp or cnn");
  if (c.world_size < 1)
    throw ConfigError("--world-size: the world size must be at least 1, got " + std::to_string(c.world_size));
  if (c.world_size > kMaxWorldSize)
    throw ConfigError("--world-size: at most " + std::to_string(kMaxWorldSize) + " ranks are supported, got " +
                      std::to_string(c.world_size));
  if (c.batch_size <= 0)
    throw ConfigError("batch_size should be a positive integer value, but got batch_size=" +
                          std::to_string(c.batch_size),
                      "--batch-size is the per-rank batch size; the global batch is world_size x batch_size");
  if (c.eval_batch_size <= 0)
    throw ConfigError("--eval-batch-size must be positive, got " + std::to_string(c.eval_batch_size));
  if (c.eval_every < 0) throw ConfigError("--eval-every must be >= 0 (0: off), got " + std::to_string(c.eval_every));
  if (c.eval_samples < 1) throw ConfigError("--eval-samples must be at least 1, got " + std::to_string(c.eval_samples));
  if (c.bn != "local" && c.bn != "sync")
    throw ConfigError("--bn: unknown mode '" + c.bn + "'", "local: per-rank statistics (DDP with BatchNorm); "
                                                           "sync: SyncBatchNorm (global statistics)");
  if (c.comm != "threads" && c.comm != "mpi" && c.comm != "nccl")
    throw ConfigError("--comm: unknown transport '" + c.comm + "'",
                      "threads: emulated ranks in this process; mpi: one process per rank under mpirun; nccl: ranks "
                      "as threads of this process, one GPU each (with --device cuda)");
  if (c.allreduce != "ring" && c.allreduce != "naive" && c.allreduce != "tree" && c.allreduce != "mpi" &&
      c.allreduce != "nccl")
    throw ConfigError("--allreduce: unknown algorithm '" + c.allreduce + "'",
                      "choose ring, naive (gather to rank 0), tree (recursive halving-doubling), mpi or nccl");
  if (c.allreduce == "mpi" && c.comm != "mpi")
    throw ConfigError("--allreduce mpi needs --comm mpi (a transport with its own allreduce)");
  if (c.allreduce == "nccl" && c.comm != "nccl")
    throw ConfigError("--allreduce nccl needs --comm nccl (NCCL's own allreduce)");
  if (c.comm == "nccl") {
    if (!parse_device(c.compute.device).is_cuda())
      throw ConfigError("--comm nccl: NCCL moves GPU memory between GPUs: it needs --device cuda (got --device " +
                            c.compute.device + ")",
                        "add --device cuda, or use --comm threads for emulated ranks on the CPU");
  }
  if (c.epochs < 1 && c.steps <= 0)
    throw ConfigError("--epochs must be at least 1, got " + std::to_string(c.epochs));
  if (c.steps < 0) throw ConfigError("--steps must be >= 0, got " + std::to_string(c.steps));
  // PyTorch's wording (torch.optim.SGD), after the flag's name
  if (!(c.lr >= 0) || !std::isfinite(c.lr)) throw ConfigError("--lr " + num(c.lr) + ": Invalid learning rate: " + num(c.lr));
  if (!(c.momentum >= 0) || !std::isfinite(c.momentum))
    throw ConfigError("--momentum " + num(c.momentum) + ": Invalid momentum value: " + num(c.momentum));
  if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay))
    throw ConfigError("--weight-decay " + num(c.weight_decay) + ": Invalid weight_decay value: " + num(c.weight_decay));
  if (c.lr_schedule != "constant" && c.lr_schedule != "cosine" && c.lr_schedule != "step")
    throw ConfigError("--lr-schedule: unknown schedule '" + c.lr_schedule + "'", "choose constant, cosine or step");
  if (c.lr_t_max < 0) throw ConfigError("--lr-t-max must be at least 1 (or 0: the run's epochs), got " + std::to_string(c.lr_t_max));
  if (!(c.lr_min >= 0) || !std::isfinite(c.lr_min)) throw ConfigError("--lr-min must be >= 0, got " + std::to_string(c.lr_min));
  if (c.lr_step_size < 1) throw ConfigError("--lr-step-size must be at least 1, got " + std::to_string(c.lr_step_size));
  if (!(c.lr_gamma > 0) || !std::isfinite(c.lr_gamma)) throw ConfigError("--lr-gamma must be > 0, got " + std::to_string(c.lr_gamma));
  if (c.optimizer != "sgd" && c.optimizer != "adam" && c.optimizer != "adamw")
    throw ConfigError("--optimizer: unknown optimizer '" + c.optimizer + "'",
                      "choose sgd (torch.optim.SGD), adam (torch.optim.Adam) or adamw (torch.optim.AdamW)");
  if (c.optimizer == "sgd" && c.nesterov && c.momentum <= 0)
    throw ConfigError("Nesterov momentum requires a momentum and zero dampening", "pass --momentum > 0");
  // PyTorch's wording (torch.optim.Adam)
  if (!(c.adam_eps >= 0) || !std::isfinite(c.adam_eps))
    throw ConfigError("--eps " + num(c.adam_eps) + ": Invalid epsilon value: " + num(c.adam_eps));
  if (!(c.adam_beta1 >= 0 && c.adam_beta1 < 1))
    throw ConfigError("--betas " + num(c.adam_beta1) + "," + num(c.adam_beta2) +
                      ": Invalid beta parameter at index 0: " + num(c.adam_beta1));
  if (!(c.adam_beta2 >= 0 && c.adam_beta2 < 1))
    throw ConfigError("--betas " + num(c.adam_beta1) + "," + num(c.adam_beta2) +
                      ": Invalid beta parameter at index 1: " + num(c.adam_beta2));
  if (c.bn_momentum && (*c.bn_momentum < 0 || *c.bn_momentum > 1))
    throw ConfigError("--bn-momentum must be in [0, 1] or 'none', got " + bn_momentum_str(c.bn_momentum));
  if (!(c.bn_eps > 0)) throw ConfigError("--bn-eps must be positive");
  if (!(c.bucket_cap_mb > 0)) throw ConfigError("--bucket-cap-mb must be positive");
  if (!(c.timeout_s > 0)) throw ConfigError("--timeout must be positive (seconds)");
  if (c.threads < 0) throw ConfigError("--threads must be >= 0 (0: one per core)");
  if (c.limit_train < 0 || c.limit_test < 0) throw ConfigError("--limit-train/--limit-test must be >= 0");
  if (c.fail_rank >= c.world_size)
    throw ConfigError("Invalid rank " + std::to_string(c.fail_rank) + ", rank should be in the interval [0, " +
                      std::to_string(c.world_size - 1) + "]",
                      "--fail-rank names the rank that fails");
  if (c.fail_at != "forward" && c.fail_at != "backward" && c.fail_at != "allreduce" && c.fail_at != "hang" &&
      c.fail_at != "nan")
    throw ConfigError("--fail-at: unknown point '" + c.fail_at + "'", "choose forward, backward, allreduce, hang or nan");
  if (c.on_nonfinite != "stop" && c.on_nonfinite != "skip-step")
    throw ConfigError("--on-nonfinite: unknown action '" + c.on_nonfinite + "'", "choose stop or skip-step");
  if (!mode_of(c).caps().skip_step && (c.on_nonfinite != "stop" || (c.fail_at == "nan" && c.fail_rank >= 0)))
    throw ConfigError("--on-nonfinite skip-step and --fail-at nan cover --mode " + modes_with(&ModeCaps::skip_step),
                      "--mode " + c.mode + " stops at a non-finite loss or gradient");
  if (c.record_bn != "auto" && c.record_bn != "all" && c.record_bn != "off") {
    char* end = nullptr;
    const long long every = std::strtoll(c.record_bn.c_str(), &end, 10);
    if (c.record_bn.empty() || *end != 0 || every < 1)
      throw ConfigError("--record-bn: expected auto, all, off or a whole number N >= 1 (every N-th step), got '" +
                            c.record_bn + "'",
                        "auto records every step of the first epoch, then every 10th");
  }
  if (c.checkpoint_every < 0) throw ConfigError("--checkpoint-every must be >= 0 (0: off), got " + std::to_string(c.checkpoint_every));
  const bool checkpoints = c.checkpoint_every > 0 || c.checkpoint_every_epoch;
  if ((checkpoints || !c.resume.empty()) && !mode_of(c).caps().checkpoints)
    throw ConfigError(std::string(!c.resume.empty() ? "--resume" : c.checkpoint_every > 0 ? "--checkpoint-every" : "--checkpoint-every-epoch") +
                      " with --mode " + c.mode + ": checkpoints and --resume cover --mode " +
                      modes_with(&ModeCaps::checkpoints));
  if ((checkpoints || !c.resume.empty()) && (c.uneven_data || c.join))
    throw ConfigError("checkpoints and --resume need every rank at the same iteration: not with --uneven-data or --join");
  if (checkpoints && c.out_dir.empty() && c.resume.empty())
    throw ConfigError("--checkpoint-every/--checkpoint-every-epoch write into the run directory: give --out DIR");
  if (c.checkpoint_every > 0 && c.no_sync_steps > 0 && c.checkpoint_every % (c.no_sync_steps + 1) != 0)
    throw ConfigError("--checkpoint-every " + std::to_string(c.checkpoint_every) + " must be a multiple of --no-sync-steps + 1 = " +
                          std::to_string(c.no_sync_steps + 1),
                      "a checkpoint is taken after a synchronized step, when no gradients are accumulating");
  if (c.nondeterministic && c.comm != "threads")
    throw ConfigError("--nondeterministic adds in arrival order between emulated ranks and compute threads",
                      "use --comm threads (the default)");
  validate_compute_options(c.compute);
  if (c.compute.cuda_graphs) refuse_graphs_where_they_cannot_apply(c);
  const std::vector<int> devices = rank_device_map(c.compute, c.world_size, c.comm);  // checks --rank-devices' length
  if (c.comm == "nccl") check_one_rank_per_gpu(devices, c.compute.rank_nodes);
  if (!parse_device(c.compute.device).is_cpu() && c.nondeterministic)
    throw ConfigError("--nondeterministic is the CPU's emulation of atomic adds: not with --device " + c.compute.device,
                      "on a GPU, --cudnn-benchmark lets cuDNN pick its fastest algorithm, which may add with atomics");
  validate_modes(c);
}

}  // namespace

// --cuda-graphs: the step a CUDA Graph captures must be the same work every step, with nothing the
// host decides in the middle of it (executor.h: graph_step).
void refuse_graphs_where_they_cannot_apply(const RunConfig& c) {
  const std::string why = "--cuda-graphs captures DDP's training step of one rank (forward, loss, backward, SGD) once and "
                          "replays it: ";
  if (c.mode != "ddp")
    throw ConfigError("--cuda-graphs with --mode " + c.mode + ": " + why + "not " + c.mode + "'s step", "use --mode ddp");
  if (c.world_size != 1)
    throw ConfigError("--cuda-graphs with --world-size " + std::to_string(c.world_size) + ": " + why +
                          "the ranks' collectives are driven by the host (the threads transport, MPI), which a graph "
                          "cannot capture",
                      "use --world-size 1; NCCL's collectives could be captured, one rank per GPU, which dtlab does not do yet");
  if (c.optimizer != "sgd")
    throw ConfigError("--cuda-graphs with --optimizer " + c.optimizer + ": " + why + "Adam's bias corrections change every "
                          "step, and its kernel takes them as arguments, so every step would be a new capture",
                      "use --optimizer sgd");
  if (c.bn == "sync")
    throw ConfigError("--cuda-graphs with --bn sync: " + why + "SyncBatchNorm brings every rank's count to the host "
                          "in the middle of the forward", "use --bn local");
  if (!c.bn_momentum)
    throw ConfigError("--cuda-graphs with --bn-momentum none: " + why + "the cumulative average's factor, 1 / "
                          "num_batches_tracked, changes every step", "give --bn-momentum a number (0.1: PyTorch's default)");
  if (c.no_sync_steps > 0)
    throw ConfigError("--cuda-graphs with --no-sync-steps: " + why + "no_sync's steps accumulate gradients and take no "
                          "optimizer step, a different step", "leave --no-sync-steps at 0");
}

void validate(const RunConfig& c) {
  validate_values(c);
  refuse_ineffective_settings(c);  // settings that could do nothing where an effect is clearly expected
}

namespace {

std::string q(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}
std::string b(bool v) { return v ? "true" : "false"; }
std::string d(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  std::string t = s.str();
  if (t.find_first_of(".eE") == std::string::npos && t.find("inf") == std::string::npos) t += ".0";
  return t;
}

}  // namespace

std::string to_toml(const RunConfig& c, const std::vector<std::pair<std::string, std::string>>& backends) {
  std::ostringstream o;
  o << "# dtlab run configuration (resolved). Read back by `dtlab gui --open` and lessons.\n";
  o << "format_version = " << kConfigFormatVersion << "\n";
  o << "dtlab_version = " << q(kDtlabVersion) << "\n\n";
  o << "[backends]\n";
  for (const auto& kv : backends) o << kv.first << " = " << q(kv.second) << "\n";
  o << "\n[model]\n";
  o << "model = " << q(c.model) << "\n";
  o << "bn = " << q(c.bn) << "\n";
  o << "bn_momentum = " << (c.bn_momentum ? d(*c.bn_momentum) : q("none")) << "\n";
  o << "bn_eps = " << d(c.bn_eps) << "\n";
  o << "track_running_stats = " << b(c.track_running_stats) << "\n";
  o << "batchnorm = " << b(c.batchnorm) << "\n";
  o << "\n[data]\n";
  o << "data_dir = " << q(c.data_dir) << "\n";
  o << "limit_train = " << c.limit_train << "\n";
  o << "limit_test = " << c.limit_test << "\n";
  o << "batch_size = " << c.batch_size << "\n";
  o << "shuffle = " << b(c.shuffle) << "\n";
  o << "drop_last = " << b(c.drop_last) << "\n";
  o << "sampler_drop_last = " << b(c.sampler_drop_last) << "\n";
  o << "eval_batch_size = " << c.eval_batch_size << "\n";
  o << "\n[distributed]\n";
  o << "world_size = " << c.world_size << "\n";
  o << "comm = " << q(c.comm) << "\n";
  o << "broadcast_buffers = " << b(c.broadcast_buffers) << "\n";
  o << "bucket_cap_mb = " << d(c.bucket_cap_mb) << "\n";
  o << "timeout_s = " << d(c.timeout_s) << "\n";
  o << "allreduce = " << q(c.allreduce) << "\n";
  o << "mode = " << q(c.mode) << "\n";
  o << "average_every = " << c.average_every << "\n";
  o << "warmup_steps = " << c.warmup_steps << "\n";
  o << "overlap = " << b(c.overlap) << "\n";
  o << "no_sync_steps = " << c.no_sync_steps << "\n";
  o << "parameters_as_bucket_view = " << b(c.parameters_as_bucket_view) << "\n";
  o << "sharding_strategy = " << q(c.sharding_strategy) << "\n";
  o << "fsdp_wrap = " << q(c.fsdp_wrap) << "\n";
  o << "stages = " << c.stages << "\n";
  o << "microbatches = " << c.microbatches << "\n";
  o << "schedule = " << q(c.schedule) << "\n";
  o << "balance = " << q(c.balance) << "\n";
  o << "deferred_batch_norm = " << b(c.deferred_batch_norm) << "\n";
  o << "dp = " << c.dp << "\n";
  o << "tp = " << c.tp << "\n";
  o << "link_latency_us = " << d(c.link_latency_us) << "\n";
  o << "link_gbps = " << d(c.link_gbps) << "\n";
  o << "link_gpus_per_node = " << c.link_gpus_per_node << "\n";
  o << "link_nic_gbps = " << d(c.link_nic_gbps) << "\n";
  o << "link_nic_latency_us = " << d(c.link_nic_latency_us) << "\n";
  o << "link_nics_per_node = " << c.link_nics_per_node << "\n";
  o << "link_nodes_per_leaf = " << c.link_nodes_per_leaf << "\n";
  o << "link_oversubscription = " << d(c.link_oversubscription) << "\n";
  o << "uneven_data = " << b(c.uneven_data) << "\n";
  o << "join = " << b(c.join) << "\n";
  o << "async_schedule = " << q(c.async_schedule) << "\n";
  o << "async_seed = " << c.async_seed << "\n";
  o << "\n[optim]\n";
  o << "optimizer = " << q(c.optimizer) << "\n";
  o << "lr = " << d(c.lr) << "\n";
  o << "momentum = " << d(c.momentum) << "\n";
  o << "weight_decay = " << d(c.weight_decay) << "\n";
  o << "nesterov = " << b(c.nesterov) << "\n";
  o << "betas = [" << d(c.adam_beta1) << ", " << d(c.adam_beta2) << "]\n";
  o << "eps = " << d(c.adam_eps) << "\n";
  o << "lr_schedule = " << q(c.lr_schedule) << "\n";
  o << "lr_t_max = " << c.lr_t_max << "\n";
  o << "lr_min = " << d(c.lr_min) << "\n";
  o << "lr_step_size = " << c.lr_step_size << "\n";
  o << "lr_gamma = " << d(c.lr_gamma) << "\n";
  o << "\n[schedule]\n";
  o << "epochs = " << c.epochs << "\n";
  o << "steps = " << c.steps << "\n";
  o << "seed = " << c.seed << "\n";
  o << "threads = " << c.threads << "\n";
  o << "nondeterministic = " << b(c.nondeterministic) << "\n";
  o << "\n[compute]\n";
  o << "device = " << q(c.compute.device) << "\n";
  o << "allow_tf32 = " << b(c.compute.allow_tf32) << "\n";
  o << "cudnn_benchmark = " << b(c.compute.cudnn_benchmark) << "\n";
  o << "cudnn_deterministic = " << b(c.compute.cudnn_deterministic) << "\n";
  o << "cuda_graphs = " << b(c.compute.cuda_graphs) << "\n";
  o << "rank_devices = [";
  for (size_t i = 0; i < c.compute.rank_devices.size(); ++i) o << (i ? ", " : "") << c.compute.rank_devices[i];
  o << "]\n";
  o << "\n[output]\n";
  o << "out_dir = " << q(c.out_dir) << "\n";
  o << "init = " << q(c.init) << "\n";
  o << "trace_steps = " << c.trace_steps << "\n";
  o << "record_bn = " << q(c.record_bn) << "\n";
  o << "record_memory = " << b(c.record_memory) << "\n";
  o << "checkpoint_every = " << c.checkpoint_every << "\n";
  o << "checkpoint_every_epoch = " << b(c.checkpoint_every_epoch) << "\n";
  o << "eval_every = " << c.eval_every << "\n";
  o << "eval_samples = " << c.eval_samples << "\n";
  o << "\n[failure_injection]\n";
  o << "fail_rank = " << c.fail_rank << "\n";
  o << "fail_step = " << c.fail_step << "\n";
  o << "fail_at = " << q(c.fail_at) << "\n";
  o << "on_nonfinite = " << q(c.on_nonfinite) << "\n";
  return o.str();
}

namespace {
RunConfig config_from_table(const toml::table& t, const std::string& path);
}  // namespace

RunConfig config_from_toml_file(const std::string& path) {
  toml::table t;
  try {
    t = parse_toml_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << path << ":" << e.source().begin.line << ": " << e.description();
    throw ConfigError(s.str());
  }
  return config_from_table(t, path);
}

RunConfig config_from_toml(const std::string& text, const std::string& name) {
  toml::table t;
  try {
    t = parse_toml(text, name);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << name << ":" << e.source().begin.line << ": " << e.description();
    throw ConfigError(s.str());
  }
  return config_from_table(t, name);
}

namespace {
RunConfig config_from_table(const toml::table& t, const std::string& path) {
  RunConfig c;
  auto fail = [&](const std::string& key, const char* want) {
    throw ConfigError(path + ": key '" + key + "' must be " + want);
  };
  for (const auto& [section_key, section_node] : t) {
    const std::string section(section_key.str());
    if (section == "format_version" || section == "dtlab_version") continue;
    const toml::table* tab = section_node.as_table();
    if (!tab) throw ConfigError(path + ": unexpected top-level key '" + section + "'");
    if (section == "backends") continue;
    for (const auto& [k, value] : *tab) {
      // A plain reference for the lambdas below: C++17 lambdas cannot capture a structured binding
      // (GCC allows it, clang does not).
      const toml::node& node = value;
      const std::string key = section + "." + std::string(k.str());
      auto str = [&](std::string& dst) {
        if (auto v = node.value<std::string>()) dst = *v; else fail(key, "a string");
      };
      auto i64 = [&](int64_t& dst) {
        if (auto v = node.value<int64_t>()) dst = *v; else fail(key, "an integer");
      };
      auto i32 = [&](int& dst) {
        if (auto v = node.value<int64_t>()) dst = static_cast<int>(*v); else fail(key, "an integer");
      };
      auto dbl = [&](double& dst) {
        if (auto v = node.value<double>()) dst = *v; else fail(key, "a number");
      };
      auto bln = [&](bool& dst) {
        if (auto v = node.value<bool>()) dst = *v; else fail(key, "true or false");
      };
      if (key == "model.model") str(c.model);
      else if (key == "model.bn") str(c.bn);
      else if (key == "model.bn_momentum") {
        if (auto v = node.value<double>()) c.bn_momentum = *v;
        else if (auto s = node.value<std::string>(); s && *s == "none") c.bn_momentum.reset();
        else fail(key, "a number or \"none\"");
      } else if (key == "model.bn_eps") dbl(c.bn_eps);
      else if (key == "model.track_running_stats") bln(c.track_running_stats);
      else if (key == "model.batchnorm") bln(c.batchnorm);
      else if (key == "data.data_dir") str(c.data_dir);
      else if (key == "data.limit_train") i64(c.limit_train);
      else if (key == "data.limit_test") i64(c.limit_test);
      else if (key == "data.batch_size") i64(c.batch_size);
      else if (key == "data.shuffle") bln(c.shuffle);
      else if (key == "data.drop_last") bln(c.drop_last);
      else if (key == "data.sampler_drop_last") bln(c.sampler_drop_last);
      else if (key == "data.eval_batch_size") i64(c.eval_batch_size);
      else if (key == "distributed.world_size") i32(c.world_size);
      else if (key == "distributed.comm") str(c.comm);
      else if (key == "distributed.broadcast_buffers") bln(c.broadcast_buffers);
      else if (key == "distributed.bucket_cap_mb") dbl(c.bucket_cap_mb);
      else if (key == "distributed.timeout_s") dbl(c.timeout_s);
      else if (key == "distributed.allreduce") str(c.allreduce);
      else if (key == "distributed.mode") str(c.mode);
      else if (key == "distributed.average_every") i64(c.average_every);
      else if (key == "distributed.warmup_steps") i64(c.warmup_steps);
      else if (key == "distributed.overlap") bln(c.overlap);
      else if (key == "distributed.no_sync_steps") i64(c.no_sync_steps);
      else if (key == "distributed.parameters_as_bucket_view") bln(c.parameters_as_bucket_view);
      else if (key == "distributed.sharding_strategy") str(c.sharding_strategy);
      else if (key == "distributed.fsdp_wrap") str(c.fsdp_wrap);
      else if (key == "distributed.stages") i32(c.stages);
      else if (key == "distributed.microbatches") i64(c.microbatches);
      else if (key == "distributed.schedule") str(c.schedule);
      else if (key == "distributed.balance") str(c.balance);
      else if (key == "distributed.deferred_batch_norm") bln(c.deferred_batch_norm);
      else if (key == "distributed.dp") i32(c.dp);
      else if (key == "distributed.tp") i32(c.tp);
      else if (key == "distributed.link_latency_us") dbl(c.link_latency_us);
      else if (key == "distributed.link_gbps") dbl(c.link_gbps);
      else if (key == "distributed.link_gpus_per_node") i32(c.link_gpus_per_node);
      else if (key == "distributed.link_nic_gbps") dbl(c.link_nic_gbps);
      else if (key == "distributed.link_nic_latency_us") dbl(c.link_nic_latency_us);
      else if (key == "distributed.link_nics_per_node") i32(c.link_nics_per_node);
      else if (key == "distributed.link_nodes_per_leaf") i32(c.link_nodes_per_leaf);
      else if (key == "distributed.link_oversubscription") dbl(c.link_oversubscription);
      else if (key == "distributed.uneven_data") bln(c.uneven_data);
      else if (key == "distributed.join") bln(c.join);
      else if (key == "distributed.async_schedule") str(c.async_schedule);
      else if (key == "distributed.async_seed") {
        int64_t v = 0;
        i64(v);
        c.async_seed = static_cast<uint64_t>(v);
      }
      else if (key == "optim.optimizer") str(c.optimizer);
      else if (key == "optim.betas") {
        const toml::array* a = node.as_array();
        std::optional<double> b1, b2;
        if (a && a->size() == 2) {
          b1 = (*a)[0].value<double>();
          b2 = (*a)[1].value<double>();
        }
        if (!b1 || !b2) fail(key, "an array of two numbers, [beta1, beta2]");
        c.adam_beta1 = *b1;
        c.adam_beta2 = *b2;
      }
      else if (key == "optim.eps") dbl(c.adam_eps);
      else if (key == "optim.lr") dbl(c.lr);
      else if (key == "optim.momentum") dbl(c.momentum);
      else if (key == "optim.weight_decay") dbl(c.weight_decay);
      else if (key == "optim.nesterov") bln(c.nesterov);
      else if (key == "optim.lr_schedule") str(c.lr_schedule);
      else if (key == "optim.lr_t_max") i64(c.lr_t_max);
      else if (key == "optim.lr_min") dbl(c.lr_min);
      else if (key == "optim.lr_step_size") i64(c.lr_step_size);
      else if (key == "optim.lr_gamma") dbl(c.lr_gamma);
      else if (key == "schedule.epochs") i64(c.epochs);
      else if (key == "schedule.steps") i64(c.steps);
      else if (key == "schedule.seed") {
        int64_t s = 0;
        i64(s);
        c.seed = static_cast<uint64_t>(s);
      } else if (key == "schedule.threads") i32(c.threads);
      else if (key == "schedule.nondeterministic") bln(c.nondeterministic);
      else if (key == "compute.device") str(c.compute.device);
      else if (key == "compute.allow_tf32") bln(c.compute.allow_tf32);
      else if (key == "compute.cudnn_benchmark") bln(c.compute.cudnn_benchmark);
      else if (key == "compute.cudnn_deterministic") bln(c.compute.cudnn_deterministic);
      else if (key == "compute.cuda_graphs") bln(c.compute.cuda_graphs);
      else if (key == "compute.rank_devices") {
        const toml::array* a = node.as_array();
        if (!a) fail(key, "an array of GPU indices");
        c.compute.rank_devices.clear();
        for (const toml::node& e : *a) {
          if (auto v = e.value<int64_t>()) c.compute.rank_devices.push_back(static_cast<int>(*v));
          else fail(key, "an array of GPU indices");
        }
      }
      else if (key == "output.out_dir") str(c.out_dir);
      else if (key == "output.init") str(c.init);
      else if (key == "output.trace_steps") i64(c.trace_steps);
      else if (key == "output.record_bn") str(c.record_bn);
      else if (key == "output.record_memory") bln(c.record_memory);
      else if (key == "output.checkpoint_every") i64(c.checkpoint_every);
      else if (key == "output.checkpoint_every_epoch") bln(c.checkpoint_every_epoch);
      else if (key == "output.eval_every") i64(c.eval_every);
      else if (key == "output.eval_samples") i64(c.eval_samples);
      else if (key == "failure_injection.fail_rank") i32(c.fail_rank);
      else if (key == "failure_injection.fail_step") i64(c.fail_step);
      else if (key == "failure_injection.fail_at") str(c.fail_at);
      else if (key == "failure_injection.on_nonfinite") str(c.on_nonfinite);
      else throw ConfigError(path + ": unknown key '" + key + "'");
    }
  }
  // Not refuse_ineffective_settings: a finished run whose configuration had a setting without
  // effect (made before the rule, or by hand) still opens; starting a run from it (--resume)
  // validates it whole.
  validate_values(c);
  return c;
}
}  // namespace

}  // namespace lab
