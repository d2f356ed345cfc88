// dtlab: the command-line front end. One core, thin front ends: this file parses flags into a
// RunConfig, runs lab::Run and renders its snapshots; it alone decides exit codes (README).
//
//   dtlab run   [flags]        train, write a run directory
//   mpirun -np N dtlab run --comm mpi [flags]   the same with one process per rank
//   dtlab bench train [flags]  training throughput (samples/s) on a fixed batch
//   dtlab bench sgemm [flags]  the sgemm backend's GFLOP/s (the roofline of bench train)
//   dtlab bench allreduce [flags]  allreduce time and bandwidth per size, nccl-tests style
//   dtlab gui   [flags]        the lab window (gui_command.cpp); also `dtlab` alone on a display
//   dtlab version
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "backends.h"
#include "bench_allreduce.h"
#include "bench_train.h"
#include "config.h"
#include "errors.h"
#include "gemm.h"
#include "gui_command.h"
#include "cpu/openblas_env.h"
#include "run.h"

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void on_sigint(int) { g_interrupted = 1; }

// Parallelism modes and communication behaviour.
void add_mode_flags(CLI::App& app, lab::RunConfig& c) {
  app.add_option("--mode", c.mode,
                 "ddp (DistributedDataParallel), dp (nn.DataParallel: one process, world-size devices, "
                 "--batch-size is the global batch) or local-sgd (periodic model averaging)")
      ->capture_default_str();
  app.add_option("--average-every", c.average_every, "local-sgd: average the parameters every K steps (PeriodicModelAverager period)")
      ->capture_default_str();
  app.add_option("--warmup-steps", c.warmup_steps, "local-sgd: first allreduce gradients every step for W steps")
      ->capture_default_str();
  app.add_flag("!--no-overlap", c.overlap,
               "ddp: launch the bucket allreduces after the whole backward instead of overlapping it");
  app.add_option("--no-sync-steps", c.no_sync_steps,
                 "ddp: K backward passes under no_sync (gradients accumulate) before each synchronized step")
      ->capture_default_str();
  app.add_option("--link-latency-us", c.link_latency_us, "simulated link between ranks: latency per message (us)")
      ->capture_default_str();
  app.add_option("--link-gbps", c.link_gbps, "simulated link between ranks: bandwidth in Gbit/s (0: unlimited)")
      ->capture_default_str();
  app.add_flag("--uneven-data", c.uneven_data, "rank r drops the last r batches of its shard each epoch (uneven inputs)");
  app.add_flag("--join", c.join, "ddp: DDP's join context: ranks out of data shadow the others' collectives");
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
  app.add_option("--epochs", c.epochs, "passes over the training set")->capture_default_str();
  app.add_option("--steps", c.steps, "stop after this many iterations (0: run all epochs)")->capture_default_str();
  app.add_option("--lr", c.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "SGD weight decay (L2, added to the gradient)")->capture_default_str();
  app.add_flag("--nesterov", c.nesterov, "SGD with Nesterov momentum");
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
  app.add_flag("!--no-track-running-stats", c.track_running_stats,
               "BatchNorm track_running_stats=False: batch statistics in train and eval mode");
  app.add_flag("!--no-broadcast-buffers", c.broadcast_buffers,
               "DDP broadcast_buffers=False: every rank keeps its own BatchNorm running statistics");
  app.add_option("--bucket-cap-mb", c.bucket_cap_mb, "DDP bucket_cap_mb (the first bucket is 1 MiB)")->capture_default_str();
  app.add_flag("!--no-shuffle", c.shuffle, "DistributedSampler shuffle=False: indices in order");
  app.add_flag("--drop-last", c.drop_last, "DataLoader drop_last=True: drop each rank's last incomplete batch");
  app.add_flag("--sampler-drop-last", c.sampler_drop_last,
               "DistributedSampler drop_last=True: cut the tail instead of padding with repeated samples");
  app.add_option("--data-dir", c.data_dir, "directory of the Fashion-MNIST .gz files (default: the Debian package's)");
  app.add_option("--limit-train", c.limit_train, "use only the first N training samples (0: all)")->capture_default_str();
  app.add_option("--limit-test", c.limit_test, "use only the first N test samples (0: all)")->capture_default_str();
  app.add_option("--eval-batch-size", c.eval_batch_size, "batch size for evaluation on the test set")->capture_default_str();
  app.add_option("--threads", c.threads, "compute threads (0: one per core); with several ranks, one BLAS thread each")
      ->capture_default_str();
  app.add_option("--comm", c.comm,
                 "transport between ranks: threads (emulated ranks in this process) or mpi (one process per rank, "
                 "started by mpirun)")
      ->capture_default_str();
  app.add_option("--timeout", c.timeout_s, "seconds any collective may wait before the run fails")->capture_default_str();
  app.add_option("--allreduce", c.allreduce,
                 "allreduce algorithm: ring, naive (gather to rank 0 and back), tree (recursive halving-doubling), "
                 "mpi (the transport's own, with --comm mpi)")
      ->capture_default_str();
  app.add_option("--out", c.out_dir, "run directory to write (config, metrics, trace, weights, summary)");
  app.add_option("--init", c.init, "start from these weights (safetensors with PyTorch state_dict names)");
  app.add_option("--trace-steps", c.trace_steps, "iterations written to trace.json (-1: all)")->capture_default_str();
  app.add_option("--eval-every", c.eval_every,
                 "evaluate a copy of rank 0's model in eval and train mode every N iterations (0: off)")
      ->capture_default_str();
  app.add_option("--eval-samples", c.eval_samples, "test samples used by --eval-every")->capture_default_str();
  app.add_option("--fail-rank", c.fail_rank, "teaching aid: make this rank fail ...")->capture_default_str();
  app.add_option("--fail-step", c.fail_step, "... at this iteration (default 0) ...")->capture_default_str();
  app.add_option("--fail-at", c.fail_at, "... in forward, backward or allreduce, or hang (stop answering)")->capture_default_str();
  add_mode_flags(app, c);
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

void print_mode_header(const lab::RunConfig& c) {
  std::printf("  mode=%s", c.mode.c_str());
  if (c.mode == "dp") std::printf(" (one process, %d devices, global batch %lld)", c.world_size, static_cast<long long>(c.batch_size));
  if (c.mode == "local-sgd")
    std::printf(" average_every=%lld warmup_steps=%lld", static_cast<long long>(c.average_every),
                static_cast<long long>(c.warmup_steps));
  if (c.mode != "dp") std::printf(" overlap=%s", c.overlap ? "on" : "off");
  if (c.no_sync_steps > 0) std::printf(" no_sync_steps=%lld", static_cast<long long>(c.no_sync_steps));
  if (c.uneven_data) std::printf(" uneven_data=on");
  if (c.join) std::printf(" join=on");
  if (c.link_model()) std::printf(" link=%gus/%gGbps", c.link_latency_us, c.link_gbps);
  std::printf("\n");
}

// Communication figures after a run: time in collectives, how much was hidden behind backward,
// bytes moved and rank 0's share; local SGD's drift.
void print_mode_summary(const lab::RunConfig& c, const lab::RunSummary& s) {
  if (c.world_size < 2) return;
  const lab::OverlapStats& o = s.overlap;
  const double n = static_cast<double>(c.world_size);
  std::printf("communication: %.3f s per rank in collectives, %.3f s of it hidden behind backward (%.1f%%)\n",
              o.comm_seconds_total / n, o.hidden_seconds_total / n, 100.0 * o.hidden_fraction);
  const lab::TrafficStats& t = s.traffic;
  const char* who = c.mode == "dp" ? "device 0" : "rank 0";
  std::printf("traffic: %.2f MB moved; %s sent %.2f MB and received %.2f MB: %.1f%% of all bytes moved\n",
              static_cast<double>(t.bytes_moved) / 1e6, who, t.sent.empty() ? 0.0 : static_cast<double>(t.sent[0]) / 1e6,
              t.received.empty() ? 0.0 : static_cast<double>(t.received[0]) / 1e6, 100.0 * t.rank0_share);
  if (c.mode == "local-sgd")
    std::printf("local SGD: %zu averagings; replica drift before averaging (L2 to the average): max %.4g, mean %.4g\n",
                s.drift.size(), s.drift_max, s.drift_mean);
}

void print_header(const lab::Run& run) {
  const lab::RunConfig& c = run.config();
  std::printf("dtlab %s run | model=%s world_size=%d batch_size=%lld (global %d) bn=%s broadcast_buffers=%s\n",
              lab::kDtlabVersion, c.model.c_str(), c.world_size, static_cast<long long>(c.batch_size),
              c.global_batch(), c.bn.c_str(), c.broadcast_buffers ? "on" : "off");
  std::printf("  lr=%g momentum=%g weight_decay=%g nesterov=%s | bn_momentum=%s bn_eps=%g track_running_stats=%s\n",
              c.lr, c.momentum, c.weight_decay, c.nesterov ? "on" : "off", lab::bn_momentum_str(c.bn_momentum).c_str(),
              c.bn_eps, c.track_running_stats ? "on" : "off");
  std::printf("  shuffle=%s drop_last=%s sampler_drop_last=%s seed=%llu epochs=%lld steps=%lld (%lld per epoch) "
              "bucket_cap_mb=%g timeout=%gs\n",
              c.shuffle ? "on" : "off", c.drop_last ? "on" : "off", c.sampler_drop_last ? "on" : "off",
              static_cast<unsigned long long>(c.seed), static_cast<long long>(c.epochs),
              static_cast<long long>(run.steps_total()), static_cast<long long>(run.steps_per_epoch()), c.bucket_cap_mb,
              c.timeout_s);
  std::printf("  data=%s (train %lld, test %lld)", c.data_dir.c_str(), static_cast<long long>(run.train_set().size),
              static_cast<long long>(run.test_set().size));
  for (const auto& kv : run.backends()) std::printf(" %s=%s", kv.first.c_str(), kv.second.c_str());
  std::printf("\n  out=%s\n", c.out_dir.empty() ? "(none: pass --out DIR to keep a run directory)" : c.out_dir.c_str());
  print_mode_header(c);
  std::fflush(stdout);
}

class Progress {
 public:
  explicit Progress(const lab::Run& run) : m_run(run), m_tty(isatty(STDOUT_FILENO)) {}
  void operator()(const lab::Snapshot& s) {
    while (m_epochs_printed < s.epochs.size()) {
      const lab::EpochRecord& e = s.epochs[m_epochs_printed++];
      if (m_tty) std::printf("\r\033[K");
      std::printf("epoch %lld/%lld  train loss %.4f acc %.4f | test (eval mode) loss %.4f acc %.4f | %.1f s, %.0f samples/s\n",
                  static_cast<long long>(e.epoch + 1), static_cast<long long>(m_run.config().epochs), e.train_loss,
                  e.train_acc, e.test_loss, e.test_acc, e.seconds, e.samples_per_s);
    }
    if (m_tty && !s.latest.empty()) {
      const lab::StepRecord& r = s.latest[0];
      const int64_t done = r.batch_size ? r.step + 1 : 0;
      const int width = 30;
      const int fill = s.steps_total ? static_cast<int>(width * done / s.steps_total) : 0;
      std::string bar(static_cast<size_t>(fill), '#');
      bar.resize(width, '.');
      const long long epochs = s.steps_per_epoch ? (s.steps_total + s.steps_per_epoch - 1) / s.steps_per_epoch : 1;
      std::printf("\r\033[K[%s] epoch %lld/%lld step %lld/%lld  loss %.4f  acc %.3f  %.0f samples/s", bar.c_str(),
                  static_cast<long long>(r.epoch + 1), epochs, static_cast<long long>(done),
                  static_cast<long long>(s.steps_total), r.loss,
                  r.batch_size ? static_cast<double>(r.correct) / static_cast<double>(r.batch_size) : 0.0,
                  s.samples_per_s);
    }
    std::fflush(stdout);
  }
  void done() {
    if (m_tty) std::printf("\r\033[K");
  }

 private:
  const lab::Run& m_run;
  bool m_tty;
  size_t m_epochs_printed = 0;
};

int cmd_run(lab::RunConfig& c) {
  lab::Run run(c, lab::make_world);
  // With ranks in several processes (--comm mpi) rank 0's process alone reports; the others
  // print only their own errors.
  const bool report = run.is_local(0);
  if (report) print_header(run);
  Progress progress(run);
  std::signal(SIGINT, on_sigint);
  run.start();
  while (!run.poll()) {
    if (g_interrupted) {
      run.control().stop();
      break;
    }
    if (report) progress(*run.snapshot());
    usleep(100000);
  }
  if (g_interrupted) {
    progress.done();
    std::fprintf(stderr, "dtlab: interrupted; the run directory holds what was finished\n");
    try {
      run.finish();
    } catch (const std::exception&) {
    }
    return lab::kExitInterrupted;
  }
  if (report) progress(*run.snapshot());
  const lab::RunSummary& s = run.finish();
  if (!report) return lab::kExitOk;
  progress.done();
  std::printf("done: %lld steps, %lld epochs, %.1f s training, %.0f samples/s\n", static_cast<long long>(s.steps),
              static_cast<long long>(s.epochs_completed), s.train_seconds, s.samples_per_s);
  std::printf("test accuracy: %.4f eval mode (running statistics), %.4f train mode (batch statistics); loss %.4f / %.4f\n",
              s.eval_mode.acc, s.train_mode.acc, s.eval_mode.loss, s.train_mode.loss);
  if (!s.eval_mode_per_rank.empty()) {
    std::printf("ranks hold different running statistics; eval-mode accuracy per rank:");
    for (const auto& e : s.eval_mode_per_rank) std::printf(" %.4f", e.acc);
    std::printf("\n");
  }
  print_mode_summary(c, s);
  if (!c.out_dir.empty()) std::printf("run directory: %s\n", c.out_dir.c_str());
  return lab::kExitOk;
}

// Starts the transport's process-wide runtime (MPI_Init for --comm mpi, nothing for threads)
// into `runtime`, which main() shuts down whatever happens, and takes the world size from it.
// Every command with a --comm flag calls this before it makes a world.
void start_runtime(std::unique_ptr<lab::CommRuntime>& runtime, lab::RunConfig& cfg, bool world_size_given) {
  runtime = lab::start_comm_runtime(cfg);
  runtime->resolve_world(cfg, world_size_given);
  if (runtime->rank() == 0 && !runtime->describe().empty()) std::printf("%s\n", runtime->describe().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  lab::ensure_openblas_coretype(argc, argv);
  CLI::App app{"dtlab: the Distributed Training Lab. Data-parallel training, exactly as PyTorch does it, made visible.\n"
               "Exit codes: 0 ok, 1 internal error, 2 bad flag or value, 3 dataset problem, 4 file I/O,\n"
               "5 training error (e.g. BatchNorm batch of one), 6 communication failure or timeout,\n"
               "7 no display for `dtlab gui` (or a build without the GUI), 130 interrupted.",
               "dtlab"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "show help for every command");

  lab::RunConfig cfg;
  std::string bn_momentum = "0.1";
  CLI::App* run_cmd = app.add_subcommand("run", "train with N emulated ranks and write a run directory");
  add_run_flags(*run_cmd, cfg, bn_momentum);

  CLI::App* bench_cmd = app.add_subcommand("bench", "benchmarks (ratios against peers come from tools/ scripts)");
  bench_cmd->require_subcommand(1);
  lab::BenchTrainOptions bopt;
  CLI::App* bench_train = bench_cmd->add_subcommand("train", "training samples per second on a fixed random batch");
  bench_train->add_option("--model", bopt.model, "mlp or cnn")->capture_default_str();
  bench_train->add_option("--batch-size", bopt.batch_size, "per-rank batch size")->capture_default_str();
  bench_train->add_option("--world-size", bopt.world_size, "emulated ranks (DDP with ring allreduce)")->capture_default_str();
  bench_train->add_option("--threads", bopt.threads, "BLAS threads for one rank (ranks use one each)")->capture_default_str();
  bench_train->add_option("--seconds", bopt.seconds, "target seconds per timing round")->capture_default_str();
  bench_train->add_option("--rounds", bopt.rounds, "timing rounds (the median is reported)")->capture_default_str();

  lab::BenchSgemmOptions sopt;
  CLI::App* bench_sgemm = bench_cmd->add_subcommand("sgemm", "GFLOP/s of the sgemm backend (the roofline of bench train)");
  bench_sgemm->add_option("--size", sopt.size, "M = N = K")->capture_default_str();
  bench_sgemm->add_option("--threads", sopt.threads, "BLAS threads")->capture_default_str();
  bench_sgemm->add_option("--seconds", sopt.seconds, "target seconds per timing round")->capture_default_str();
  bench_sgemm->add_option("--rounds", sopt.rounds, "timing rounds (the median is reported)")->capture_default_str();

  lab::BenchAllreduceOptions aopt;
  CLI::App* bench_allreduce = bench_cmd->add_subcommand(
      "allreduce", "allreduce time, algbw, busbw and #wrong per size (nccl-tests style), with a copy floor");
  bench_allreduce->add_option("--world-sizes", aopt.world_sizes, "world sizes, e.g. 2,4,8")
      ->delimiter(',')
      ->capture_default_str();
  bench_allreduce->add_option("--algorithms", aopt.algorithms, "algorithms among ring,naive,tree")
      ->delimiter(',')
      ->capture_default_str();
  bench_allreduce->add_option("--comm", aopt.comm, "transport: threads (emulated ranks)")->capture_default_str();
  bench_allreduce->add_option("--min-bytes", aopt.min_bytes, "smallest message (bytes)")->capture_default_str();
  bench_allreduce->add_option("--max-bytes", aopt.max_bytes, "largest message (bytes)")->capture_default_str();
  bench_allreduce->add_option("--step-factor", aopt.step_factor, "each size is this times the previous one")
      ->capture_default_str();
  bench_allreduce->add_option("--warmup", aopt.warmup, "untimed calls per size and algorithm")->capture_default_str();
  bench_allreduce->add_option("--batches", aopt.batches, "timed batches (the median is reported)")->capture_default_str();
  bench_allreduce->add_option("--batch-seconds", aopt.batch_seconds, "target seconds per batch")->capture_default_str();
  bench_allreduce->add_option("--max-calls", aopt.max_calls, "calls per batch at most")->capture_default_str();
  bench_allreduce->add_option("--timeout", aopt.timeout_s, "seconds a rank may wait before the benchmark fails")
      ->capture_default_str();

  app.add_subcommand("version", "print the version and the backends of this build");

  // The gui takes the run flags (its starting configuration, with the lab's defaults) plus its own.
  lab::RunConfig gui_cfg = gui_default_config();
  std::string gui_bn_momentum = "0.1";
  GuiOptions gui_opt;
  CLI::App* gui_cmd = app.add_subcommand("gui", "the lab window: watch, pause, step and compare a training run");
  add_run_flags(*gui_cmd, gui_cfg, gui_bn_momentum);
  add_gui_flags(*gui_cmd, gui_opt);

  if (argc == 1 && gui_available()) return cmd_gui(gui_cfg, gui_opt);
  if (argc == 1) {
    std::printf("%s\nRun `dtlab run --help` for the training flags, `dtlab --help-all` for everything.\n",
                app.help().c_str());
    return lab::kExitUsage;
  }
  std::unique_ptr<lab::CommRuntime> runtime;
  int code = lab::kExitOk;
  std::string error;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? lab::kExitOk : lab::kExitUsage;
  }
  try {
    if (app.got_subcommand("version")) {
      std::string transports;
      for (const std::string& t : lab::available_transports()) transports += (transports.empty() ? "" : ", ") + t;
      std::printf("dtlab %s (sgemm: %s; transports: %s)\n", lab::kDtlabVersion, lab::gemm_backend_name(),
                  transports.c_str());
      return lab::kExitOk;
    }
    if (run_cmd->parsed()) {
      cfg.bn_momentum = parse_bn_momentum(bn_momentum);
      start_runtime(runtime, cfg, run_cmd->count("--world-size") > 0);
      code = cmd_run(cfg);
    } else if (bench_train->parsed()) {
      code = lab::bench_train(bopt);
    } else if (bench_sgemm->parsed()) {
      code = lab::bench_sgemm(sopt);
    } else if (bench_allreduce->parsed()) {
      code = lab::bench_allreduce(aopt);
    } else if (gui_cmd->parsed()) {
      gui_cfg.bn_momentum = parse_bn_momentum(gui_bn_momentum);
      code = cmd_gui(gui_cfg, gui_opt);
    }
  } catch (const lab::Error& e) {
    std::fprintf(stderr, "dtlab: error: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "  hint: %s\n", e.hint().c_str());
    code = e.exit_code();
    error = e.what();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtlab: internal error: %s\n", e.what());
    code = lab::kExitFailure;
    error = e.what();
  }
  if (runtime) {
    // Every process of an MPI job ends here: peers are told of a failure, then all finalize
    // together; a peer that never arrives gets the job stopped (MPI_Abort) after a grace period.
    std::fflush(stdout);
    std::fflush(stderr);
    const lab::CommRuntime::ShutdownResult s = runtime->shutdown(code, error);
    if (!s.note.empty()) std::fprintf(stderr, "dtlab: %s\n", s.note.c_str());
    if (!s.clean) runtime->kill_job(code);
  }
  return code;
}
