#include "command_line.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

#include "checkpoint.h"
#include "errors.h"
#include "mode.h"

namespace commands {

// Parallelism modes and communication behaviour.
namespace {

// The simulated link's nodes (lab/comm/link_model.h: Nodes), on every command with --link-gbps.
void add_link_node_flags(CLI::App& app, lab::RunConfig& c) {
  app.add_option("--link-gpus-per-node", c.link_gpus_per_node,
                 "simulated link: place the ranks on nodes of N ranks each, in order (rank / N; the world size a "
                 "multiple of N); within a node the --link-gbps links, between nodes also the nodes' NICs (needs "
                 "--link-gbps and --link-nic-gbps; 0: one switch, no nodes)")
      ->capture_default_str();
  app.add_option("--link-nic-gbps", c.link_nic_gbps,
                 "simulated link, with --link-gpus-per-node: bandwidth of each node's NIC in Gbit/s, each direction, "
                 "shared by the node's ranks that use it")
      ->capture_default_str();
  app.add_option("--link-nic-latency-us", c.link_nic_latency_us,
                 "simulated link, with --link-gpus-per-node: latency a message between nodes adds (us)")
      ->capture_default_str();
  app.add_option("--link-nics-per-node", c.link_nics_per_node,
                 "simulated link, with --link-gpus-per-node: NICs per node, 1..N; rank i of a node uses NIC i % K")
      ->capture_default_str();
  // the leaf switches above the nodes (lab/comm/link_model.h: Leaves)
  app.add_option("--link-nodes-per-leaf", c.link_nodes_per_leaf,
                 "simulated link, with --link-gpus-per-node: place the nodes on leaf switches of M nodes each, in "
                 "order (node / M; the last leaf may hold fewer); a message between leaves also crosses its leaf's "
                 "uplink out and the other's uplink in (0: every node on one non-blocking switch)")
      ->capture_default_str();
  app.add_option("--link-oversubscription", c.link_oversubscription,
                 "simulated link, with --link-nodes-per-leaf: each leaf's uplink, each direction, carries M x K x "
                 "--link-nic-gbps / X, shared by the messages crossing it (>= 1; 1: non-blocking)")
      ->capture_default_str();
}

void add_mode_flags(CLI::App& app, lab::RunConfig& c) {
  std::string modes;  // the registry's (lab/modes/mode.h), in its order
  for (const lab::ParallelMode* m : lab::modes())
    modes += (modes.empty() ? "" : m == lab::modes().back() ? " or " : ", ") + std::string(m->name()) + " (" + m->help() + ")";
  app.add_option("--mode", c.mode, "the parallelism: " + modes)->capture_default_str();
  app.add_option("--average-every", c.average_every, "local-sgd: average the parameters every K steps (PeriodicModelAverager period)")
      ->capture_default_str();
  app.add_option("--warmup-steps", c.warmup_steps, "local-sgd: first allreduce gradients every step for W steps")
      ->capture_default_str();
  app.add_flag("--parameters-as-bucket-view", c.parameters_as_bucket_view,
               "zero: ZeroRedundancyOptimizer(parameters_as_bucket_view=True): each rank's parameters broadcast as "
               "one bucket instead of one broadcast per parameter");
  app.add_option("--sharding-strategy", c.sharding_strategy,
                 "fsdp: full_shard (ZeRO-3), shard_grad_op (ZeRO-2) or no_shard (DDP)")
      ->capture_default_str();
  app.add_option("--fsdp-wrap", c.fsdp_wrap, "fsdp: model (the whole model one unit) or layer (a unit per module)")
      ->capture_default_str();
  app.add_option("--stages", c.stages,
                 "pipeline: stages, one rank each (the world size follows it when --world-size is not given)")
      ->capture_default_str();
  app.add_option("--pp", c.stages, "pipeline: the same as --stages (Megatron-LM's pipeline_model_parallel_size)");
  app.add_option("--dp", c.dp,
                 "pipeline, tensor: data-parallel replicas of the whole pipeline (or of the tensor-parallel ranks), each "
                 "stage's (slice's) gradients allreduced over them (world size = stages x dp, tp x dp)")
      ->capture_default_str();
  app.add_option("--microbatches", c.microbatches, "pipeline: micro-batches per mini-batch (Pipe's chunks, torch.chunk)")
      ->capture_default_str();
  app.add_option("--schedule", c.schedule,
                 "pipeline: gpipe (every forward, then every backward) or 1f1b (after a warm-up, one forward and one "
                 "backward alternate)")
      ->capture_default_str();
  app.add_option("--balance", c.balance,
                 "pipeline: modules per stage, e.g. 2,3,2,1 (torchgpipe's balance; default: cut before layers, "
                 "balancing their multiply-adds)");
  app.add_flag("--deferred-batch-norm", c.deferred_batch_norm,
               "pipeline: Pipe(deferred_batch_norm=True): running statistics updated once per mini-batch, from every "
               "micro-batch's sums (biased variance)");
  app.add_option("--tp", c.tp,
                 "tensor, pipeline: ranks each split layer is cut over (Megatron-LM's tensor_model_parallel_size; "
                 "with --mode pipeline, within every stage; the world size follows it when --world-size is not given)")
      ->capture_default_str();
  app.add_flag_callback("--no-overlap", [&c] { c.overlap = false; },
               "ddp: launch the bucket allreduces after the whole backward instead of overlapping it");
  app.add_option("--no-sync-steps", c.no_sync_steps,
                 "ddp: K backward passes under no_sync (gradients accumulate) before each synchronized step")
      ->capture_default_str();
  app.add_option("--link-latency-us", c.link_latency_us, "simulated link between ranks: latency per message (us)")
      ->capture_default_str();
  app.add_option("--link-gbps", c.link_gbps, "simulated link between ranks: bandwidth in Gbit/s (0: unlimited)")
      ->capture_default_str();
  add_link_node_flags(app, c);
  app.add_flag("--uneven-data", c.uneven_data, "rank r drops the last r batches of its shard each epoch (uneven inputs)");
  app.add_flag("--join", c.join, "ddp: DDP's join context: ranks out of data shadow the others' collectives");
  app.add_option("--async-schedule", c.async_schedule,
                 "async: free (the parameter server serves whoever sends first) or seeded (a reproducible order "
                 "drawn from --async-seed)")
      ->capture_default_str();
  app.add_option("--async-seed", c.async_seed, "async: the seed of the seeded schedule")->capture_default_str();
}

}  // namespace

void add_compute_flags(CLI::App& app, lab::ComputeOptions& o, bool has_comm) {
  app.add_option("--device", o.device,
                 "where the model computes: cpu (the reference), cuda or cuda:N (cuBLAS and cuDNN; needs a build "
                 "with the GPU backend and a GPU), or sim (a simulated GPU: the GPU's protocol, its copies, "
                 "residency and timeline, with the CPU's ops; any machine)")
      ->capture_default_str();
  app.add_flag("--allow-tf32", o.allow_tf32,
               "--device cuda: allow TF32 in matrix products and convolutions (torch.backends.cuda.matmul.allow_tf32 "
               "and cudnn.allow_tf32); default IEEE float32");
  app.add_flag("--cudnn-benchmark", o.cudnn_benchmark,
               "--device cuda: time cuDNN's convolution algorithms and take the fastest (torch.backends.cudnn.benchmark)");
  app.add_flag("--cudnn-deterministic", o.cudnn_deterministic,
               "--device cuda: only deterministic cuDNN algorithms (torch.backends.cudnn.deterministic)");
  app.add_flag("--cuda-graphs", o.cuda_graphs,
               "--device cuda: capture DDP's training step of one rank (forward, loss, backward, optimizer) once as a "
               "CUDA Graph and replay it every step (torch.cuda.graphs); --world-size 1, SGD, local BatchNorm");
  app.add_option("--rank-devices", o.rank_devices,
                 has_comm ? "--device cuda: the GPU of each rank, e.g. 0,1 (default: every rank on --device's GPU; with "
                            "--comm nccl, the k-th rank of a machine on its GPU k, as NCCL refuses two ranks on one GPU)"
                          : "--device cuda: the GPU of each rank, e.g. 0,1 (default: every rank on --device's GPU)")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void add_run_flags(CLI::App& app, lab::RunConfig& c, std::string& bn_momentum) {
  // A flag given twice takes its last value, so wrappers (tools/lab.sh) can be overridden.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", c.model, "model: mlp (784-256-128-10 with BatchNorm1d) or cnn (2 conv + BatchNorm2d)")
      ->capture_default_str();
  app.add_option("--world-size", c.world_size, "number of ranks (emulated as threads), 1..64; with --comm mpi: mpirun's -np")
      ->capture_default_str();
  app.add_option("--batch-size", c.batch_size, "per-rank batch size (the global batch is world_size x batch_size)")
      ->capture_default_str();
  app.add_option("--epochs", c.epochs,
                 "passes over the training set (with --steps, the run ends at whichever limit it reaches first)")
      ->capture_default_str();
  app.add_option("--steps", c.steps,
                 "stop after this many iterations (0: no limit). Alone, it runs as many epochs as it takes; with "
                 "--epochs, the first limit reached ends the run")
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer,
                 "sgd (torch.optim.SGD), adam (torch.optim.Adam) or adamw (torch.optim.AdamW: decoupled weight "
                 "decay). --lr and --weight-decay keep dtlab's defaults for every optimizer: PyTorch's own Adam "
                 "defaults are --lr 0.001, and AdamW's --weight-decay 0.01")
      ->capture_default_str();
  app.add_option("--lr", c.lr, "learning rate")->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay,
                 "weight decay: SGD and Adam add weight_decay * w to the gradient (L2); AdamW multiplies w by "
                 "1 - lr * weight_decay")
      ->capture_default_str();
  app.add_flag("--nesterov", c.nesterov, "SGD with Nesterov momentum");
  app.add_option_function<std::vector<double>>(
         "--betas",
         [&c](const std::vector<double>& v) {
           if (v.size() != 2)
             throw CLI::ValidationError("--betas", "expected two numbers, beta1,beta2 (e.g. 0.9,0.999)");
           c.adam_beta1 = v[0];
           c.adam_beta2 = v[1];
         },
         "Adam, AdamW: betas, the decay of the first and second moment estimates (default 0.9,0.999)")
      ->delimiter(',')
      ->expected(2);
  app.add_option("--eps", c.adam_eps, "Adam, AdamW: eps, added to the denominator")->capture_default_str();
  app.add_option("--lr-schedule", c.lr_schedule,
                 "learning rate per epoch: constant, cosine (CosineAnnealingLR) or step (StepLR); steps after each epoch")
      ->capture_default_str();
  app.add_option("--lr-t-max", c.lr_t_max, "cosine: T_max in epochs (0: the run's epochs)")->capture_default_str();
  app.add_option("--lr-min", c.lr_min, "cosine: eta_min, the lowest learning rate")->capture_default_str();
  app.add_option("--lr-step-size", c.lr_step_size, "step: epochs between decays (StepLR step_size)")->capture_default_str();
  app.add_option("--lr-gamma", c.lr_gamma, "step: decay factor (StepLR gamma)")->capture_default_str();
  app.add_option("--seed", c.seed, "seed: torch.manual_seed for the initial weights, DistributedSampler seed")
      ->capture_default_str();
  app.add_option("--bn", c.bn, "BatchNorm across ranks: local (per-rank statistics) or sync (SyncBatchNorm)")
      ->capture_default_str();
  app.add_option("--bn-momentum", bn_momentum, "BatchNorm momentum (weight of the new batch) or 'none' (cumulative average)")
      ->capture_default_str();
  app.add_option("--bn-eps", c.bn_eps, "BatchNorm eps")->capture_default_str();
  app.add_flag_callback("--no-batchnorm", [&c] { c.batchnorm = false; },
               "the model without its BatchNorm layers (what bench train --no-batchnorm measures)");
  app.add_flag_callback("--no-track-running-stats", [&c] { c.track_running_stats = false; },
               "BatchNorm track_running_stats=False: batch statistics in train and eval mode");
  app.add_flag_callback("--no-broadcast-buffers", [&c] { c.broadcast_buffers = false; },
               "DDP broadcast_buffers=False: every rank keeps its own BatchNorm running statistics");
  app.add_option("--bucket-cap-mb", c.bucket_cap_mb, "DDP bucket_cap_mb (the first bucket is 1 MiB)")->capture_default_str();
  app.add_flag_callback("--no-shuffle", [&c] { c.shuffle = false; }, "DistributedSampler shuffle=False: indices in order");
  app.add_flag("--drop-last", c.drop_last, "DataLoader drop_last=True: drop each rank's last incomplete batch");
  app.add_flag("--sampler-drop-last", c.sampler_drop_last,
               "DistributedSampler drop_last=True: cut the tail instead of padding with repeated samples");
  app.add_option("--data-dir", c.data_dir, "directory of the Fashion-MNIST .gz files (default: the Debian package's)");
  app.add_option("--limit-train", c.limit_train, "use only the first N training samples (0: all)")->capture_default_str();
  app.add_option("--limit-test", c.limit_test, "use only the first N test samples (0: all)")->capture_default_str();
  app.add_option("--eval-batch-size", c.eval_batch_size, "batch size for evaluation on the test set")->capture_default_str();
  app.add_option("--threads", c.threads, "compute threads (0: one per core); with several ranks, one BLAS thread each")
      ->capture_default_str();
  add_compute_flags(app, c.compute);
  app.add_flag("--nondeterministic", c.nondeterministic,
               "teaching aid: the gradient sums over the batch (Linear, Conv2d, BatchNorm) add their partial sums in "
               "an order that changes from run to run, as GPU atomics do (and the naive allreduce gathers in arrival "
               "order): two runs differ in the last bits. Refused where every sum has at most two contributions "
               "(the mlp with --batch-size 2 or less)");
  app.add_option("--comm", c.comm,
                 "transport between ranks: threads (emulated ranks in this process), mpi (one process per rank, "
                 "started by mpirun) or nccl (one GPU per rank, with --device cuda: ranks as threads, or as processes "
                 "when started by mpirun, MPI starting them and NCCL carrying the collectives)")
      ->capture_default_str();
  app.add_option("--timeout", c.timeout_s, "seconds any collective may wait before the run fails")->capture_default_str();
  app.add_option("--allreduce", c.allreduce,
                 "allreduce algorithm: ring, naive (gather to rank 0 and back), tree (recursive halving-doubling), "
                 "mpi or nccl (the transport's own, with --comm mpi or --comm nccl)")
      ->capture_default_str();
  app.add_option("--out", c.out_dir,
                 "run directory to write (config, metrics, trace, weights, summary): a new or empty folder; an "
                 "earlier run there is refused (continue it with --resume, or replace it with --overwrite)");
  app.add_flag("--overwrite", c.overwrite,
               "replace the run already in --out (only the files a run writes: a folder that is not a run "
               "directory is never written into)");
  app.add_option("--init", c.init, "start from these weights (safetensors with PyTorch state_dict names)");
  app.add_option("--checkpoint-every", c.checkpoint_every,
                 "write a checkpoint into the run directory every N iterations (0: off); --resume continues from it")
      ->capture_default_str();
  app.add_flag("--checkpoint-every-epoch", c.checkpoint_every_epoch, "write a checkpoint at the start of every epoch");
  app.add_option("--resume", c.resume,
                 "continue the run directory's newest committed checkpoint (its configuration; with --out elsewhere: "
                 "a copy continues there)");
  app.add_option("--trace-steps", c.trace_steps, "iterations written to trace.json (-1: all)")->capture_default_str();
  app.add_option("--record-bn", c.record_bn,
                 "BatchNorm statistics kept in bn_stats.bin: auto (every step of the first epoch, then every 10th), "
                 "all, off, or N (every N-th step)")
      ->capture_default_str();
  app.add_flag("--record-memory", c.record_memory,
               "metrics.jsonl: every step's memory per rank and category at each point of the step (summary.json's "
               "\"memory\" has the peak step's either way)");
  app.add_option("--eval-every", c.eval_every,
                 "evaluate a copy of rank 0's model in eval and train mode every N iterations (0: off)")
      ->capture_default_str();
  app.add_option("--eval-samples", c.eval_samples, "test samples used by --eval-every")->capture_default_str();
  app.add_option("--fail-rank", c.fail_rank, "teaching aid: make this rank fail ...")->capture_default_str();
  app.add_option("--fail-step", c.fail_step, "... at this iteration (default 0) ...")->capture_default_str();
  app.add_option("--fail-at", c.fail_at,
                 "... in forward, backward or allreduce, hang (stop answering), or nan (a NaN in its loss gradient)")
      ->capture_default_str();
  app.add_option("--on-nonfinite", c.on_nonfinite,
                 "a NaN or infinite loss or gradient: stop (fail naming rank, iteration and layer, before the allreduce "
                 "spreads it) or skip-step (no optimizer step where the averaged gradient is not finite, as AMP's "
                 "GradScaler)")
      ->capture_default_str();
  add_mode_flags(app, c);
}

void apply_steps_rule(const CLI::App& app, lab::RunConfig& c) {
  if (app.count("--steps") && c.steps > 0 && !app.count("--epochs")) c.epochs = 0;  // as many as --steps takes
  // --stages P (--pp P) alone: P ranks, one per stage, times the --dp replicas and the --tp slices
  // of each stage; --tp T alone: T ranks, one per slice, times the --dp replicas (with --world-size
  // too, validate() checks they agree)
  if (app.count("--world-size")) return;
  const bool stages = (app.count("--stages") || app.count("--pp")) && c.stages > 0;
  if (stages) c.world_size = c.stages * std::max(1, c.dp) * std::max(1, c.tp);
  else if (app.count("--tp") && c.tp > 0) c.world_size = c.tp * std::max(1, c.dp);
}

std::optional<double> parse_bn_momentum(const std::string& s) {
  if (s == "none" || s == "None") return std::nullopt;
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw lab::ConfigError("--bn-momentum: expected a number or 'none', got '" + s + "'");
}


void add_bench_train_flags(CLI::App& app, lab::BenchTrainOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", o.model, "mlp or cnn")->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "per-rank batch size")->capture_default_str();
  app.add_option("--world-size", o.world_size, "emulated ranks (DDP with ring allreduce)")->capture_default_str();
  app.add_option("--threads", o.threads, "BLAS threads for one rank (ranks use one each)")->capture_default_str();
  add_compute_flags(app, o.compute, false);
  app.add_option("--seconds", o.seconds, "target seconds per timing round")->capture_default_str();
  app.add_option("--rounds", o.rounds, "timing rounds (the median is reported)")->capture_default_str();
  app.add_option("--batch-sizes", o.batch_sizes,
                 "a sweep instead of --batch-size: one row per size, e.g. 2,8,32,128,512 (ms per sample, speed-up)")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--per-sample", o.per_sample,
               "also process the same batch one sample at a time (gradients accumulated x 1/B, one SGD step): "
               "times, ratio and the gradients' difference (with --batch-sizes: the largest batch, after the sweep)");
  app.add_option("--per-sample-bn", o.per_sample_bn,
                 "--per-sample's BatchNorm: frozen (eval mode, running statistics) or train (each sample's own "
                 "statistics; the mlp's BatchNorm1d refuses a batch of one)")
      ->capture_default_str();
  app.add_flag_callback("--no-batchnorm", [&o] { o.batchnorm = false; },
               "build the model without its BatchNorm layers (the same other layers and initial weights)");
  app.add_option("--json", o.json_out, "also write the figures to this file as JSON");
}

void add_bench_sgemm_flags(CLI::App& app, lab::BenchSgemmOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--size", o.size, "M = N = K")->capture_default_str();
  app.add_option("--threads", o.threads, "BLAS threads")->capture_default_str();
  app.add_option("--seconds", o.seconds, "target seconds per timing round")->capture_default_str();
  app.add_option("--rounds", o.rounds, "timing rounds (the median is reported)")->capture_default_str();
  app.add_option("--json", o.json_out, "also write the figures to this file as JSON");
}

void add_bench_allreduce_flags(CLI::App& app, lab::BenchAllreduceOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--world-sizes", o.world_sizes, "world sizes, e.g. 2,4,8")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  app.add_option("--collective", o.collective,
                 "what to time: allreduce, reduce_scatter (block r of N summed onto rank r) or allgather (every rank's "
                 "block to every rank), as nccl-tests' all_reduce_perf, reduce_scatter_perf, all_gather_perf")
      ->capture_default_str();
  app.add_option("--algorithms", o.algorithms, "algorithms among ring,naive,tree")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  app.add_option("--comm", o.comm, "transport: threads (emulated ranks)")->capture_default_str();
  app.add_option("--min-bytes", o.min_bytes, "smallest message (bytes)")->capture_default_str();
  app.add_option("--max-bytes", o.max_bytes, "largest message (bytes)")->capture_default_str();
  app.add_option("--step-factor", o.step_factor, "each size is this times the previous one")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed calls per size and algorithm")->capture_default_str();
  app.add_option("--batches", o.batches, "timed batches (the median is reported)")->capture_default_str();
  app.add_option("--batch-seconds", o.batch_seconds, "target seconds per batch")->capture_default_str();
  app.add_option("--max-calls", o.max_calls, "calls per batch at most")->capture_default_str();
  app.add_option("--device", o.device,
                 "where the buffers live: cpu (host memory), sim or cuda[:N] (every rank's buffer on that device: the "
                 "ring's copies device-to-device and its adds there, naive and tree staged through the host; the copy "
                 "floor a device-to-device copy)")
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "seconds a rank may wait before the benchmark fails")->capture_default_str();
  app.add_option("--json", o.json_out, "also write every figure to this file as JSON");
}

void add_bench_chain_flags(CLI::App& app, lab::BenchChainOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--dims", o.dims, "the chain's dims d0,d1,...,dn: A_i is d(i-1) x d(i), e.g. 8,4096,4096,4096,8")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  app.add_option("--threads", o.threads, "sgemm thread counts, e.g. 1,2: every order runs at each")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->capture_default_str();
  app.add_option("--seconds", o.seconds, "target seconds per timing round")->capture_default_str();
  app.add_option("--rounds", o.rounds, "timing rounds (the median is reported)")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the matrices' values (TorchGenerator, uniform in [-1, 1])")
      ->capture_default_str();
  app.add_option("--json", o.json_out, "also write every figure to this file as JSON");
}

void add_bench_layouts_flags(CLI::App& app, lab::BenchLayoutsOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  lab::RunConfig& c = o.base;
  c.threads = 1;  // (one compute thread per rank: the ranks share the machine's cores)
  c.world_size = 4;
  app.add_option("--model", c.model, "mlp or cnn")->capture_default_str();
  app.add_option("--world-size", c.world_size, "ranks: every dp x pp x tp that makes it is a layout")
      ->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "samples per iteration over the whole grid (each replica: G / dp)")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "iterations measured per layout (after one that warms up)")->capture_default_str();
  app.add_option("--microbatches", o.microbatches, "a pipeline's micro-batches (at most its replica's batch)")
      ->capture_default_str();
  app.add_option("--schedule", c.schedule, "a pipeline's schedule: gpipe or 1f1b")->capture_default_str();
  app.add_option("--link-gbps", c.link_gbps, "the simulated link's bandwidth, Gbit/s (0: unlimited)")
      ->capture_default_str();
  app.add_option("--link-latency-us", c.link_latency_us, "the simulated link's latency per message, microseconds")
      ->capture_default_str();
  add_link_node_flags(app, c);
  app.add_option("--allreduce", c.allreduce, "the allreduce algorithm: ring, naive or tree")->capture_default_str();
  app.add_option("--threads", c.threads, "compute threads per rank")->capture_default_str();
  app.add_option("--seed", c.seed, "torch.manual_seed: the initial weights and the shuffle")->capture_default_str();
  app.add_option("--data-dir", c.data_dir, "Fashion-MNIST's directory (default: the Debian package's)");
  app.add_option("--timeout", c.timeout_s, "seconds a blocking collective waits before the run fails")
      ->capture_default_str();
  app.add_option("--json", o.json_out, "also write every figure to this file as JSON");
}

void add_eval_flags(CLI::App& app, lab::EvalCommandOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--run", o.run_dir, "a run directory: its model (config.toml) and final weights (final.safetensors)");
  app.add_option("--weights", o.weights, "a safetensors file with PyTorch state_dict names (default with --run: "
                                         "<run>/final.safetensors)");
  app.add_option("--rank", o.rank, "with --run: rank R's running statistics where they differ from rank 0's "
                                   "(no broadcast_buffers)")
      ->capture_default_str();
  app.add_option("--model", o.model, "mlp or cnn (default with --run: the run's model)");
  app.add_option("--bn-mode", o.bn_mode, "eval: model.eval() (running statistics); train: model.train() "
                                         "(each test batch's own statistics)")
      ->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "test samples per forward pass")->capture_default_str();
  app.add_option("--limit-test", o.limit_test, "use only the first N test samples (0: all; default: with --run, the "
                                               "run's own --limit-test, else all)");
  app.add_option("--data-dir", o.data_dir, "directory of the Fashion-MNIST .gz files (default: the run's, else the "
                                           "Debian package's)");
  app.add_option("--probe", o.probe, "print (and with --json, write) the softmax outputs of the first K test samples")
      ->capture_default_str();
  app.add_option("--autocast", o.autocast,
                 "none or bf16: evaluate as under torch.autocast(\"cpu\", dtype=torch.bfloat16), beside float32 "
                 "(accuracy, agreement, speedup)")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "compute threads (0: one per core)")->capture_default_str();
  app.add_option("--device", o.compute.device, "where the forwards run: cpu, cuda, cuda:N or sim (float32)")
      ->capture_default_str();
  app.add_option("--json", o.json_out, "also write every figure (and every sample's prediction) as JSON");
}

const std::vector<std::string>& lesson_commands() {
  static const std::vector<std::string> k = {"run", "bench train", "bench sgemm", "bench allreduce", "bench chain", "eval",
                                             "simulate"};
  return k;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest(const std::string& name, const std::vector<std::string>& known, size_t max_distance) {
  std::string best;
  size_t best_d = max_distance + 1;
  for (const std::string& k : known) {
    const size_t d = edit_distance(name, k);
    // a prefix counts as close too ("bench all" for "bench allreduce")
    if (d < best_d || (best.empty() && k.rfind(name, 0) == 0 && name.size() >= 2)) {
      best_d = std::min(d, best_d);
      best = k;
    }
  }
  return best;
}

std::string unknown_flag_message(const CLI::App& app, const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a.rfind("--", 0) != 0) continue;
    const std::string name = a.substr(0, a.find('='));
    if (app.get_option_no_throw(name)) continue;
    std::vector<std::string> known;
    for (const CLI::Option* o : app.get_options())
      for (const std::string& n : o->get_lnames()) known.push_back("--" + n);
    const std::string best = closest(name, known, 3);
    return "unknown flag " + name + (best.empty() ? "" : " (did you mean " + best + "?)");
  }
  return "";
}

std::string unknown_command_message(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* cur = &app;
  std::string path = app.get_name();
  for (const std::string& a : args) {
    if (a.empty() || a[0] == '-') return "";  // flags belong to the command named so far
    const std::vector<const CLI::App*> subs = cur->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return "";  // a command's own arguments
    const CLI::App* next = nullptr;
    std::vector<std::string> names;
    for (const CLI::App* s : subs) {
      names.push_back(s->get_name());
      if (s->get_name() == a) next = s;
    }
    if (!next) {
      const std::string best = closest(a, names, 2);
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      return "unknown command '" + path + " " + a + "'" + (best.empty() ? "" : " (did you mean " + path + " " + best + "?)") +
             "; the commands are: " + list;
    }
    cur = next;
    path += " " + a;
  }
  if (cur != &app && cur->get_require_subcommand_min() > 0) {  // "dtlab bench" alone
    std::string list;
    for (const CLI::App* sub : cur->get_subcommands([](const CLI::App*) { return true; }))
      list += (list.empty() ? "" : ", ") + sub->get_name();
    return "'" + path + "' needs a command: " + list;
  }
  return "";
}

lab::RunConfig resume_config(const CLI::App& app, const lab::RunConfig& given, const lab::RunConfig* stand_in) {
  static const std::set<std::string> may_change = {"--resume",     "--out",      "--timeout",          "--threads",
                                                   "--comm",       "--world-size", "--data-dir",       "--checkpoint-every",
                                                   "--checkpoint-every-epoch", "--overwrite"};
  std::set<std::string> run_flags;  // the flags of dtlab run (an app may have more of its own)
  {
    CLI::App probe;
    lab::RunConfig scratch;
    std::string bn;
    add_run_flags(probe, scratch, bn);
    for (const CLI::Option* o : probe.get_options()) run_flags.insert(o->get_name(false, true).substr(0, o->get_name(false, true).find(',')));
  }
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() == 0) continue;
    const std::string name = o->get_name(false, true).substr(0, o->get_name(false, true).find(','));
    if (run_flags.count(name) && !may_change.count(name))
      throw lab::ConfigError(
          "--resume continues the run as its checkpoint configured it: " + name + " cannot be given with it",
          "drop " + name + ". To train differently from its weights, start a new run with --init " + given.resume +
              "/final.safetensors (or a checkpoint's rank0.safetensors)");
  }
  lab::RunConfig c;
  if (stand_in) {
    c = *stand_in;
  } else {
    const lab::FoundCheckpoint found = lab::find_checkpoint(given.resume);
    const lab::CheckpointState st = lab::read_checkpoint_state(found.dir);
    c = lab::config_from_toml(st.config_toml, found.dir + "/state.json");
  }
  c.resume = given.resume;
  c.out_dir = app.count("--out") ? given.out_dir : given.resume;
  c.overwrite = given.overwrite;
  if (app.count("--timeout")) c.timeout_s = given.timeout_s;
  if (app.count("--threads")) c.threads = given.threads;
  if (app.count("--comm")) c.comm = given.comm;
  if (app.count("--world-size")) c.world_size = given.world_size;
  if (app.count("--data-dir")) c.data_dir = given.data_dir;
  if (app.count("--checkpoint-every")) c.checkpoint_every = given.checkpoint_every;
  if (app.count("--checkpoint-every-epoch")) c.checkpoint_every_epoch = given.checkpoint_every_epoch;
  lab::validate(c);
  return c;
}

CommandSpec parse_command(const std::string& command, const std::vector<std::string>& args,
                          const std::function<const lab::RunConfig*(const std::string&)>& resume_stand_in) {
  CommandSpec spec;
  spec.command = command;
  spec.args = args;
  CLI::App app{"dtlab " + command, "dtlab " + command};
  app.set_help_flag();  // none: a lesson's run cannot ask for help
  std::string bn_momentum = "0.1";
  if (command == "run") add_run_flags(app, spec.run, bn_momentum);
  else if (command == "bench train") add_bench_train_flags(app, spec.bench_train);
  else if (command == "bench sgemm") add_bench_sgemm_flags(app, spec.bench_sgemm);
  else if (command == "bench allreduce") add_bench_allreduce_flags(app, spec.bench_allreduce);
  else if (command == "bench chain") add_bench_chain_flags(app, spec.bench_chain);
  else if (command == "eval") add_eval_flags(app, spec.eval);
  else if (command == "simulate") add_simulate_flags(app, spec.simulate);
  else {
    std::string known;
    for (const std::string& c : lesson_commands()) known += (known.empty() ? "" : ", ") + c;
    throw lab::ConfigError("unknown command '" + command + "'", "a lesson's run uses one of: " + known);
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // An unknown flag is named, with the closest known one (CLI11 lists the leftovers backwards)
    const std::string unknown = unknown_flag_message(app, args);
    if (!unknown.empty())
      throw lab::ConfigError("dtlab " + command + ": " + unknown, "dtlab " + command + " --help lists every flag");
    std::string what = e.what();
    if (what.empty()) what = e.get_name();
    throw lab::ConfigError("dtlab " + command + ": " + what);
  }
  if (command == "run") {
    spec.run.bn_momentum = parse_bn_momentum(bn_momentum);
    apply_steps_rule(app, spec.run);
    spec.world_size_given = app.count("--world-size") > 0;
    if (!spec.run.resume.empty())
      spec.run = resume_config(app, spec.run, resume_stand_in ? resume_stand_in(spec.run.resume) : nullptr);
    lab::validate(spec.run);
  }
  if (command == "simulate") lab::check_simulate_options(spec.simulate);  // each message names its flag
  return spec;
}

std::string command_line(const std::string& command, const std::vector<std::string>& args) {
  std::string out = "dtlab " + command;
  for (const std::string& a : args) {
    const bool plain = !a.empty() && a.find_first_of(" \t\n'\"\\$`*?;&|<>(){}[]#~") == std::string::npos;
    if (plain) {
      out += " " + a;
      continue;
    }
    std::string q = "'";
    for (char ch : a) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    out += " " + q + "'";
  }
  return out;
}

std::vector<std::string> split_args(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
      if (in_word) out.push_back(cur);
      cur.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (ch == '\\' && i + 1 < text.size()) {
      cur += text[++i];
    } else if (ch == '\'' || ch == '"') {
      const size_t close = text.find(ch, i + 1);
      if (close == std::string::npos)
        throw lab::ConfigError(std::string("unterminated ") + (ch == '\'' ? "single" : "double") + " quote in '" + text + "'");
      for (size_t j = i + 1; j < close; ++j) {
        if (ch == '"' && text[j] == '\\' && j + 1 < close) ++j;
        cur += text[j];
      }
      i = close;
    } else {
      cur += ch;
    }
  }
  if (in_word) out.push_back(cur);
  return out;
}

void write_result_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path, std::ios::trunc);
  if (f) f << j.dump(2) << "\n";
  if (!f) throw lab::IoError("cannot write " + path + ": " + std::strerror(errno));
}

void add_simulate_flags(CLI::App& app, lab::SimulateOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--topology", o.topology, "a preset (dgx-h100, hgx-a100, pcie-eth) or a TOML file (docs/simulate.md)")
      ->capture_default_str();
  app.add_option("--nodes", o.nodes, "node counts: a list, '...' continuing a progression (1,2,4,...,512)")
      ->capture_default_str();
  app.add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node (0: the topology's)")->capture_default_str();
  app.add_option("--collective", o.collective, "allreduce, reduce_scatter, allgather or broadcast")->capture_default_str();
  app.add_option("--algorithm", o.algorithms,
                 "ring, rhd (dtlab's tree: recursive halving-doubling), dbtree (NCCL's double binary tree), hier "
                 "(2D hierarchical), a list, or all")
      ->capture_default_str();
  app.add_option("--protocol", o.protocol, "simple, ll128, ll (NCCL's) or wire (the link alone, as dtlab's emulated ranks)")
      ->capture_default_str();
  app.add_option("--channels", o.channels, "rings or trees side by side, channel c through NIC c (0: two per NIC, as NCCL's search finds; wire: 1)")
      ->capture_default_str();
  app.add_option("--sizes", o.sizes, "sizes: LO..HI (x --step-factor), or a list; K, M, G, T are powers of 1024")
      ->capture_default_str();
  app.add_option("--step-factor", o.step_factor, "the ratio between successive sizes of a range")->capture_default_str();
  app.add_option("--json", o.json_out, "also write every figure to this file as JSON");
  app.add_option("--validate", o.validate,
                 "instead of a sweep, a validation table: emulated (against dtlab's emulated ranks; emulated-quick: "
                 "its 4-rank rows on a 32x slower link, which a busy machine does not upset), nccl (against NCCL's "
                 "cost model) or published (against measurements)");
  // --step: training steps at scale (simulate_step.h, docs/simulate.md)
  lab::SimulateStepFlags& s = o.step;
  app.add_flag("--step", s.on,
               "a training step instead of one collective: compute, each axis' communication, exposed communication "
               "and samples/s per layout as N grows (with --gpu-tflops or --compute-from)");
  app.add_option("--model", s.model,
                 "--step: mlp or cnn (dtlab's), or generic (--params, --flops-per-sample, --layers, "
                 "--activation-bytes); default cnn, generic with --params, the run's with --compute-from");
  app.add_option("--params", s.params, "--step, generic model: parameters (7e9)");
  app.add_option("--flops-per-sample", s.flops_per_sample,
                 "--step, generic model: training FLOPs per sample (about 6 x params x tokens per sample)");
  app.add_option("--layers", s.layers, "--step, generic model: layers (pipeline stages cut between them)")->capture_default_str();
  app.add_option("--activation-bytes", s.activation_bytes,
                 "--step, generic model: activation bytes per sample at a layer boundary (tokens x hidden x bytes): "
                 "pipeline sends and tensor-parallel allreduces")
      ->capture_default_str();
  app.add_option("--grad-bytes", s.grad_bytes, "--step, generic model: bytes per gradient element (4 float32, 2 bf16)")
      ->capture_default_str();
  app.add_option("--global-batch", s.global_batch, "--step: samples per step over every replica")->capture_default_str();
  app.add_option("--mode", s.mode,
                 "--step: ddp, zero (ZeRO-2), fsdp (FULL_SHARD), pipeline (needs --pp) or tensor (--tp, default the "
                 "GPUs per node); ddp, zero and fsdp also name how a grid's dp axis reduces")
      ->capture_default_str();
  app.add_option("--dp", s.dp, "--step: data-parallel replicas (0: N / (pp x tp); given: only the N it fits)")
      ->capture_default_str();
  app.add_option("--pp", s.pp, "--step: pipeline stages (0: 1)")->capture_default_str();
  app.add_option("--tp", s.tp, "--step: tensor-parallel ranks (0: 1; --mode tensor: the GPUs per node)")->capture_default_str();
  app.add_option("--layouts", s.layouts, "--step: all: every dp x pp x tp of each N, a table per (pp, tp)");
  app.add_option("--microbatches", s.microbatches, "--step, pipeline: micro-batches per step (0: 4 x pp)")
      ->capture_default_str();
  app.add_option("--schedule", s.schedule, "--step, pipeline: 1f1b or gpipe")->capture_default_str();
  app.add_option("--bucket-cap-mb,--bucket-mb", s.bucket_cap_mb, "--step: DDP's bucket_cap_mb (MiB; the first bucket 1 MiB)")
      ->capture_default_str();
  app.add_flag("--no-overlap", s.no_overlap, "--step: DDP's buckets after the whole backward instead of during it");
  app.add_flag("--no-broadcast-buffers", s.no_broadcast_buffers,
               "--step: DDP without the broadcast of BatchNorm's buffers before every forward (broadcast_buffers=False)");
  app.add_option("--gpu-tflops", s.gpu_tflops, "--step: achieved dense TFLOP/s per GPU (compute = FLOPs / this)");
  app.add_option("--compute-from", s.compute_from,
                 "--step: a dtlab run directory: its summary.json's measured forward, backward and optimizer seconds "
                 "per sample");
}

}  // namespace commands
