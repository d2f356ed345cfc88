// dtlab: the command-line front end. One core, thin front ends: this file parses flags into a
// RunConfig, runs lab::Run and renders its snapshots; it alone decides exit codes (README).
//
//   dtlab run   [flags]        train, write a run directory
//   dtlab bench train [flags]  training throughput (samples/s) on a fixed batch
//   dtlab gui   [flags]        the lab window (gui_command.cpp); also `dtlab` alone on a display
//   dtlab version
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "backends.h"
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

void add_run_flags(CLI::App& app, lab::RunConfig& c, std::string& bn_momentum) {
  app.add_option("--model", c.model, "model: mlp (784-256-128-10 with BatchNorm1d) or cnn (2 conv + BatchNorm2d)")
      ->capture_default_str();
  app.add_option("--world-size", c.world_size, "number of ranks (emulated as threads), 1..64")->capture_default_str();
  app.add_option("--batch-size", c.batch_size, "per-rank batch size (the global batch is world_size x batch_size)")
      ->capture_default_str();
  app.add_option("--epochs", c.epochs, "passes over the training set")->capture_default_str();
  app.add_option("--steps", c.steps, "stop after this many iterations (0: run all epochs)")->capture_default_str();
  app.add_option("--lr", c.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "SGD weight decay (L2, added to the gradient)")->capture_default_str();
  app.add_flag("--nesterov", c.nesterov, "SGD with Nesterov momentum");
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
  app.add_option("--comm", c.comm, "transport between ranks: threads (emulated ranks in this process)")
      ->capture_default_str();
  app.add_option("--timeout", c.timeout_s, "seconds any collective may wait before the run fails")->capture_default_str();
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
  print_header(run);
  Progress progress(run);
  std::signal(SIGINT, on_sigint);
  run.start();
  while (!run.poll()) {
    if (g_interrupted) {
      run.control().stop();
      break;
    }
    progress(*run.snapshot());
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
  progress(*run.snapshot());
  const lab::RunSummary& s = run.finish();
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
  if (!c.out_dir.empty()) std::printf("run directory: %s\n", c.out_dir.c_str());
  return lab::kExitOk;
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? lab::kExitOk : lab::kExitUsage;
  }
  try {
    if (app.got_subcommand("version")) {
      std::printf("dtlab %s (sgemm: %s; transports: threads)\n", lab::kDtlabVersion, lab::gemm_backend_name());
      return lab::kExitOk;
    }
    if (run_cmd->parsed()) {
      cfg.bn_momentum = parse_bn_momentum(bn_momentum);
      return cmd_run(cfg);
    }
    if (bench_train->parsed()) return lab::bench_train(bopt);
    if (gui_cmd->parsed()) {
      gui_cfg.bn_momentum = parse_bn_momentum(gui_bn_momentum);
      return cmd_gui(gui_cfg, gui_opt);
    }
  } catch (const lab::Error& e) {
    std::fprintf(stderr, "dtlab: error: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "  hint: %s\n", e.hint().c_str());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtlab: internal error: %s\n", e.what());
    return lab::kExitFailure;
  }
  return lab::kExitOk;
}
