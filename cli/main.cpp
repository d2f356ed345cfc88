// dtlab: the command-line front end. One core, thin front ends: this file parses flags into a
// RunConfig, runs lab::Run and renders its snapshots; it alone decides exit codes (README).
//
//   dtlab run   [flags]        train, write a run directory
//   mpirun -np N dtlab run --comm mpi [flags]   the same with one process per rank
//   dtlab bench train [flags]  training throughput (samples/s) on a fixed batch
//   dtlab bench sgemm [flags]  the sgemm backend's GFLOP/s (the roofline of bench train)
//   dtlab bench allreduce [flags]  allreduce time and bandwidth per size, nccl-tests style
//   dtlab bench chain [flags]  a matrix chain in every parenthesization, at several thread counts
//   dtlab bench layouts [flags]  every dp x pp x tp layout of N ranks: time, bytes per group, wire time
//   dtlab simulate [flags]  collectives on 1 to 4096+ GPUs over a topology: nccl-tests columns, NCCL's pick
//   dtlab eval  [flags]        test accuracy of weights in eval or train mode (eval_command.cpp)
//   dtlab lesson list|show|check|run|report|prepare   lessons (lesson_command.cpp)
//   dtlab gui   [flags]        the lab window (gui_command.cpp); also `dtlab` alone on a display
//   dtlab version
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "backends.h"
#include "bench_allreduce.h"
#include "bench_chain.h"
#include "bench_train.h"
#include "command_line.h"
#include "eval_command.h"
#include "config.h"
#include "config_effects.h"
#include "devices.h"
#include "errors.h"
#include "gemm.h"
#include "gui_command.h"
#include "lesson_command.h"
#include "mode.h"
#include "cpu/gemm_choice.h"
#include "cpu/openblas_env.h"
#include "run.h"
#include "run_progress.h"

namespace {

volatile std::sig_atomic_t g_interrupted = 0;  // the signal's number

// "1 epoch", "3 epochs"
std::string plural(int64_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}
void on_sigint(int sig) { g_interrupted = sig; }

void print_mode_header(const lab::RunConfig& c) {
  std::printf("  mode=%s", c.mode.c_str());
  if (c.compute.device != "cpu") {
    std::printf(" device=%s", c.compute.device.c_str());
    if (c.compute.allow_tf32) std::printf(" allow_tf32=on");
    if (c.compute.cudnn_benchmark) std::printf(" cudnn_benchmark=on");
    if (c.compute.cudnn_deterministic) std::printf(" cudnn_deterministic=on");
  }
  const lab::ParallelMode& mode = lab::mode_of(c);
  std::printf("%s", mode.header(c).c_str());
  if (mode.caps().gradient_allreduce) std::printf(" overlap=%s", c.overlap ? "on" : "off");
  if (c.no_sync_steps > 0) std::printf(" no_sync_steps=%lld", static_cast<long long>(c.no_sync_steps));
  if (c.uneven_data) std::printf(" uneven_data=on");
  if (c.join) std::printf(" join=on");
  if (c.link_model()) std::printf(" link=%gus/%gGbps", c.link_latency_us, c.link_gbps);
  if (c.nondeterministic) std::printf(" nondeterministic=on (%s)", lab::describe_nondeterministic(c).c_str());
  std::printf("\n");
}

// Bytes moved during training: the total, what each rank sent, and the share of the bytes that had
// rank 0 (DataParallel: device 0) at one end of their message, the master bottleneck's measure.
std::string traffic_text(const lab::RunConfig& c, const lab::TrafficStats& t) {
  const lab::ParallelMode& mode = lab::mode_of(c);
  const char* who = mode.member();
  char buf[256];
  std::snprintf(buf, sizeof buf, "traffic: %.2f MB moved during training; sent per %s (MB):",
                static_cast<double>(t.bytes_moved) / 1e6, who);
  std::string out = buf;
  if (t.sent.size() <= 8) {
    for (size_t r = 0; r < t.sent.size(); ++r) {
      std::snprintf(buf, sizeof buf, " %.2f", static_cast<double>(t.sent[r]) / 1e6);
      out += buf;
    }
  } else if (!t.sent.empty()) {
    const auto [lo, hi] = std::minmax_element(t.sent.begin(), t.sent.end());
    std::snprintf(buf, sizeof buf, " %.2f to %.2f", static_cast<double>(*lo) / 1e6, static_cast<double>(*hi) / 1e6);
    out += buf;
  }
  const std::string reason = mode.caps().master_device ? std::string(mode.title()) + " sends every byte to or from " + who + " 0"
                             : c.world_size == 2 && !mode.caps().parameter_server
                                 ? "with 2 ranks every message has rank 0 at one end"
                                 : "";
  std::snprintf(buf, sizeof buf, "\n  %.1f%% of the bytes were in messages to or from %s 0%s%s%s\n", 100.0 * t.rank0_share,
                who, reason.empty() ? "" : " (", reason.c_str(), reason.empty() ? "" : ")");
  return out + buf;
}

// Communication figures after a run: time in collectives, how much was hidden behind backward,
// bytes moved and rank 0's share; local SGD's drift.
void print_mode_summary(const lab::RunConfig& c, const lab::RunSummary& s) {
  const lab::ParallelMode& mode = lab::mode_of(c);
  if (c.world_size < 2 && !mode.caps().parameter_server) return;
  const lab::OverlapStats& o = s.overlap;
  const double n = static_cast<double>(c.world_size);
  std::printf("communication: %.3f s per rank in collectives, %.3f s of it hidden behind backward (%.1f%%)\n",
              o.comm_seconds_total / n, o.hidden_seconds_total / n, 100.0 * o.hidden_fraction);
  std::printf("%s", traffic_text(c, s.traffic).c_str());
  for (const std::string& line : mode.summary_lines(c, s)) std::printf("%s\n", line.c_str());
}

// The memory line: the rank that held the most, where, and its model states against ZeRO's formula.
void print_memory_summary(const lab::RunConfig& c, const lab::RunSummary& s) {
  const lab::RunSummary::MemoryOutline& m = s.memory;
  if (m.rank < 0) return;
  std::printf("memory: peak %.2f MB on %s %d at \"%s\" of iteration %lld; model states after the last iteration "
              "%.3f MB (the ZeRO formula %s: %.3f MB)\n",
              static_cast<double>(m.peak) / 1e6, lab::mode_of(c).member(), m.rank, m.at.c_str(),
              static_cast<long long>(m.step), static_cast<double>(m.states_end) / 1e6, m.expression.c_str(),
              static_cast<double>(m.formula) / 1e6);
}

void print_header(const lab::Run& run) {
  const lab::RunConfig& c = run.config();
  std::printf("dtlab %s run | model=%s world_size=%d batch_size=%lld (global %d) bn=%s broadcast_buffers=%s\n",
              lab::kDtlabVersion, c.model.c_str(), c.world_size, static_cast<long long>(c.batch_size),
              static_cast<int>(lab::global_batch(c)), c.bn.c_str(), c.broadcast_buffers ? "on" : "off");
  if (c.optimizer == "sgd")
    std::printf("  sgd lr=%g momentum=%g weight_decay=%g nesterov=%s", c.lr, c.momentum, c.weight_decay,
                c.nesterov ? "on" : "off");
  else
    std::printf("  %s lr=%g betas=(%g, %g) eps=%g weight_decay=%g", c.optimizer.c_str(), c.lr, c.adam_beta1,
                c.adam_beta2, c.adam_eps, c.weight_decay);
  std::printf(" | bn_momentum=%s bn_eps=%g track_running_stats=%s\n", lab::bn_momentum_str(c.bn_momentum).c_str(),
              c.bn_eps, c.track_running_stats ? "on" : "off");
  std::printf("  shuffle=%s drop_last=%s sampler_drop_last=%s seed=%llu epochs=%lld steps=%lld (%lld per epoch) "
              "bucket_cap_mb=%g timeout=%gs\n",
              c.shuffle ? "on" : "off", c.drop_last ? "on" : "off", c.sampler_drop_last ? "on" : "off",
              static_cast<unsigned long long>(c.seed), static_cast<long long>(run.epochs_total()),
              static_cast<long long>(run.steps_total()), static_cast<long long>(run.steps_per_epoch()), c.bucket_cap_mb,
              c.timeout_s);
  std::printf("  data=%s (train %lld, test %lld)", c.data_dir.c_str(), static_cast<long long>(run.train_set().size),
              static_cast<long long>(run.test_set().size));
  for (const auto& kv : run.backends()) std::printf(" %s=%s", kv.first.c_str(), kv.second.c_str());
  std::printf("\n  out=%s\n", c.out_dir.empty() ? "(none: pass --out DIR to keep a run directory)" : c.out_dir.c_str());
  print_mode_header(c);
  std::fflush(stdout);
}

// Settings given a value that has no effect in this configuration (lab/core/config_effects.h;
// validate() has refused the ones where an effect is clearly expected). `defaults`: what the
// command starts from, so that only what the user changed is reported.
void print_warnings(const lab::RunConfig& c, const lab::RunConfig& defaults) {
  for (const lab::IneffectiveSetting& e : lab::ineffective_settings(c, defaults)) {
    std::fprintf(stderr, "dtlab: warning: %s\n", e.message().c_str());
    if (!e.hint.empty()) std::fprintf(stderr, "  hint: %s\n", e.hint.c_str());
  }
  std::fflush(stderr);
}

class Progress {
 public:
  Progress(const lab::Run& run, const lab::CommRuntime& runtime)
      : m_run(run), m_runtime(runtime), m_tty(isatty(STDOUT_FILENO)) {}
  int64_t epochs_total() const { return m_run.epochs_total(); }
  void operator()(const lab::Snapshot& s) {
    while (m_epochs_printed < s.epochs.size()) {
      const lab::EpochRecord& e = s.epochs[m_epochs_printed++];
      if (m_tty) std::printf("\r\033[K");
      std::printf("epoch %lld/%lld  train loss %.4f acc %.4f | test (eval mode) loss %.4f acc %.4f | %.1f s, %.0f samples/s\n",
                  static_cast<long long>(e.epoch + 1), static_cast<long long>(epochs_total()), e.train_loss,
                  e.train_acc, e.test_loss, e.test_acc, e.seconds, e.samples_per_s);
    }
    if (m_tty && !s.latest.empty())
      std::printf("\r\033[K%s", m_line.line(s, lab::now_seconds(), m_runtime.waiting_for(), m_run.config().timeout_s).c_str());
    std::fflush(stdout);
  }
  void done() {
    if (m_tty) std::printf("\r\033[K");
  }

 private:
  const lab::Run& m_run;
  const lab::CommRuntime& m_runtime;
  bool m_tty;
  size_t m_epochs_printed = 0;
  commands::ProgressLine m_line;
};

int cmd_run(lab::RunConfig& c, const lab::CommRuntime& runtime) {
  lab::Run run(c, lab::make_world);
  // With ranks in several processes (--comm mpi) rank 0's process alone reports; the others
  // print only their own errors.
  const bool report = run.is_local(0);
  if (report) print_header(run);
  Progress progress(run, runtime);
  if (report) print_warnings(c, lab::RunConfig{});
  for (const std::string& n : run.notes()) std::fprintf(stderr, "dtlab: %s\n", n.c_str());
  if (report && run.resumed_from() >= 0)
    std::printf("resuming at iteration %lld of %lld\n", static_cast<long long>(run.resumed_from()),
                static_cast<long long>(run.steps_total()));
  // Ctrl-C, SIGTERM, and SIGUSR1 (which mpirun forwards to every process without killing them
  // a second later, as it does after the SIGTERM it sends on Ctrl-C).
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  std::signal(SIGUSR1, on_sigint);
  bool stopping = false;  // Ctrl-C with a run directory: the ranks write a checkpoint and stop
  run.start();
  while (!run.poll()) {
    if (g_interrupted && !stopping) {
      // A second Ctrl-C ends the process at once (the last committed checkpoint stays usable).
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      std::signal(SIGUSR1, SIG_DFL);
      progress.done();
      const int peer = runtime.waiting_for();
      if (runtime.ranks_are_processes() && g_interrupted == SIGTERM && peer >= 0)
        // mpirun sends SIGTERM to every process when one of them ends: say which rank this one was
        // waiting for (mpirun's own message comes when the job is over).
        std::fprintf(stderr,
                     "dtlab: rank %d: SIGTERM while waiting for rank %d. Under mpirun this means a process of the job "
                     "ended: rank %d, unless it was waiting too (every rank prints whom it waited for)%s\n",
                     runtime.rank(), peer, peer,
                     c.out_dir.empty() ? "" : "; the run directory keeps its last committed checkpoint");
      if (runtime.ranks_are_processes() && g_interrupted == SIGTERM && peer >= 0) {
        // a vanished peer cannot take part in a checkpoint: mpirun ends this process in a moment
        run.control().stop();
        break;
      }
      if (run.interrupt()) {
        stopping = true;
        if (report)
          std::fprintf(stderr, "dtlab: interrupted: writing a checkpoint at the next iteration, then stopping%s\n",
                       runtime.ranks_are_processes() ? " (every rank)" : " (Ctrl-C again stops at once)");
        continue;
      }
      run.control().stop();
      break;
    }
    if (report && !stopping) progress(*run.snapshot());
    usleep(100000);
  }
  if (g_interrupted && !stopping) {
    progress.done();
    try {
      run.finish();
    } catch (const std::exception&) {
    }
    std::fprintf(stderr, "dtlab: interrupted; %s\n", commands::what_the_run_directory_keeps(c, runtime.ranks_are_processes()).c_str());
    return lab::kExitInterrupted;
  }
  const lab::RunSummary* finished = nullptr;
  if (stopping) {
    const lab::RunSummary& s = run.finish();
    finished = &s;
    if (run.interrupted_at() >= 0) {
      std::fprintf(stderr, "dtlab: stopped at iteration %lld of %lld with a checkpoint; continue with:\n  dtlab run --resume %s\n",
                   static_cast<long long>(run.interrupted_at()), static_cast<long long>(run.steps_total()),
                   c.out_dir.c_str());
      std::printf("test accuracy so far: %.4f eval mode, %.4f train mode\n", s.eval_mode.acc, s.train_mode.acc);
      return lab::kExitInterrupted;
    }
    // (the run ended before the next iteration: it is complete)
  }
  if (report) progress(*run.snapshot());
  const lab::RunSummary& s = finished ? *finished : run.finish();
  if (!report) return lab::kExitOk;
  progress.done();
  const bool cut = run.steps_per_epoch() > 0 && s.steps % run.steps_per_epoch() != 0 && s.epochs_completed > 0;
  std::printf("done: %s, %s%s, %.1f s training, %.0f samples/s\n", plural(s.steps, "step").c_str(),
              plural(s.epochs_completed, "epoch").c_str(), cut ? " (the last one cut short by --steps)" : "",
              s.train_seconds, s.samples_per_s);
  std::printf("test accuracy: %.4f eval mode (running statistics), %.4f train mode (batch statistics); loss %.4f / %.4f\n",
              s.eval_mode.acc, s.train_mode.acc, s.eval_mode.loss, s.train_mode.loss);
  if (!s.eval_mode_per_rank.empty()) {
    std::printf("ranks hold different running statistics; eval-mode accuracy per rank:");
    for (const auto& e : s.eval_mode_per_rank) std::printf(" %.4f", e.acc);
    std::printf("\n");
  }
  print_mode_summary(c, s);
  print_memory_summary(c, s);
  if (!s.skipped_steps.empty()) {
    std::printf("non-finite gradients: %zu iterations without an optimizer step (--on-nonfinite skip-step):",
                s.skipped_steps.size());
    for (size_t i = 0; i < s.skipped_steps.size() && i < 10; ++i) std::printf(" %lld", static_cast<long long>(s.skipped_steps[i]));
    std::printf("%s\n", s.skipped_steps.size() > 10 ? " ..." : "");
  }
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
  lab::set_executor_factory(lab::make_executor);  // --device cuda (backends/devices.h)
  CLI::App app{"dtlab: the Distributed Training Lab. Data-parallel training, exactly as PyTorch does it, made visible.\n"
               "Exit codes:\n"
               "    0  ok\n"
               "    1  internal error\n"
               "    2  bad flag or value\n"
               "    3  dataset problem\n"
               "    4  file I/O (e.g. --out already holds a run)\n"
               "    5  training error (e.g. a BatchNorm batch of one)\n"
               "    6  communication failure or timeout\n"
               "    7  no display for `dtlab gui`, or a build without the GUI\n"
               "    8  a lesson's check failed\n"
               "    9  --device cuda without a GPU or GPU backend, or a GPU library failed\n"
               "   77  a lesson's requirement (e.g. MPI) is missing\n"
               "  130  interrupted (Ctrl-C)",
               "dtlab"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "show help for every command");

  lab::RunConfig cfg;
  std::string bn_momentum = "0.1";
  CLI::App* run_cmd = app.add_subcommand("run", "train with N emulated ranks and write a run directory");
  commands::add_run_flags(*run_cmd, cfg, bn_momentum);

  CLI::App* bench_cmd = app.add_subcommand("bench", "benchmarks (ratios against peers come from tools/ scripts)");
  bench_cmd->require_subcommand(1);
  lab::BenchTrainOptions bopt;
  CLI::App* bench_train = bench_cmd->add_subcommand("train", "training samples per second on a fixed random batch");
  commands::add_bench_train_flags(*bench_train, bopt);
  lab::BenchSgemmOptions sopt;
  CLI::App* bench_sgemm = bench_cmd->add_subcommand("sgemm", "GFLOP/s of the sgemm backend (the roofline of bench train)");
  commands::add_bench_sgemm_flags(*bench_sgemm, sopt);
  lab::BenchAllreduceOptions aopt;
  CLI::App* bench_allreduce = bench_cmd->add_subcommand(
      "allreduce", "allreduce time, algbw, busbw and #wrong per size (nccl-tests style), with a copy floor");
  commands::add_bench_allreduce_flags(*bench_allreduce, aopt);
  lab::BenchChainOptions copt;
  CLI::App* bench_chain = bench_cmd->add_subcommand(
      "chain", "a matrix chain in every parenthesization: FLOPs, time, GFLOP/s, thread scaling, the optimal order");
  commands::add_bench_chain_flags(*bench_chain, copt);
  lab::BenchLayoutsOptions layopt;
  CLI::App* bench_layouts = bench_cmd->add_subcommand(
      "layouts", "every dp x pp x tp layout of N ranks on one global batch and link: time, bytes per group, wire time");
  commands::add_bench_layouts_flags(*bench_layouts, layopt);

  lab::SimulateOptions simopt;
  CLI::App* simulate_cmd = app.add_subcommand(
      "simulate", "collectives on 1 to 4096+ GPUs over a cluster's topology, simulated: nccl-tests columns, "
                  "the latency/bandwidth/contention split, NCCL's pick");
  commands::add_simulate_flags(*simulate_cmd, simopt);

  lab::EvalCommandOptions eopt;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "a model's test accuracy in eval or train mode, with the outputs of the first test samples");
  commands::add_eval_flags(*eval_cmd, eopt);

  LessonCommandOptions lopt;
  CLI::App* lesson_cmd = add_lesson_command(app, lopt);

  app.add_subcommand("version", "print the version and the backends of this build");

  // The gui takes the run flags (its starting configuration, with the lab's defaults) plus its own.
  lab::RunConfig gui_cfg = gui_default_config();
  std::string gui_bn_momentum = "0.1";
  GuiOptions gui_opt;
  CLI::App* gui_cmd = app.add_subcommand("gui", "the lab window: watch, pause, step and compare a training run");
  commands::add_run_flags(*gui_cmd, gui_cfg, gui_bn_momentum);
  add_gui_flags(*gui_cmd, gui_opt);

  if (argc == 1 && gui_available()) return cmd_gui(gui_cfg, gui_opt);
  if (argc == 1) {  // no display: what dtlab is and how to start (as --help does; nothing went wrong)
    std::printf("%s\nRun `dtlab run --help` for the training flags, `dtlab --help-all` for everything.\n",
                app.help().c_str());
    return lab::kExitOk;
  }
  {
    const std::string m = commands::unknown_command_message(app, std::vector<std::string>(argv + 1, argv + argc));
    if (!m.empty()) {
      std::fprintf(stderr, "dtlab: error: %s\n", m.c_str());
      return lab::kExitUsage;
    }
  }
  std::unique_ptr<lab::CommRuntime> runtime;
  int code = lab::kExitOk;
  std::string error;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
      // name the unknown flag and the closest known one of the command that was meant
      CLI::App* cmd = &app;
      while (!cmd->get_subcommands().empty()) cmd = cmd->get_subcommands().front();
      const std::string m = commands::unknown_flag_message(*cmd, std::vector<std::string>(argv + 1, argv + argc));
      if (!m.empty()) {
        std::string path;
        for (const CLI::App* c = cmd; c && c != &app; c = c->get_parent()) path = c->get_name() + (path.empty() ? "" : " " + path);
        std::fprintf(stderr, "dtlab: error: %s\n  hint: dtlab %s --help lists every flag\n", m.c_str(), path.c_str());
        return lab::kExitUsage;
      }
    }
    return app.exit(e) == 0 ? lab::kExitOk : lab::kExitUsage;
  }
  try {
    lab::sgemm_choice_from_env();  // refuses a DTLAB_SGEMM that names no kernel
    if (app.got_subcommand("version")) {
      std::string transports;
      for (const std::string& t : lab::available_transports()) transports += (transports.empty() ? "" : ", ") + t;
      std::printf("dtlab %s (sgemm: %s; transports: %s)\n", lab::kDtlabVersion, lab::gemm_backend_name(),
                  transports.c_str());
      for (const std::string& line : lab::gpu_backend_report()) std::printf("%s\n", line.c_str());
      return lab::kExitOk;
    }
    if (run_cmd->parsed()) {
      cfg.bn_momentum = commands::parse_bn_momentum(bn_momentum);
      commands::apply_steps_rule(*run_cmd, cfg);
      if (!cfg.resume.empty()) cfg = commands::resume_config(*run_cmd, cfg);  // the checkpoint's configuration
      start_runtime(runtime, cfg, run_cmd->count("--world-size") > 0);
      code = cmd_run(cfg, *runtime);
    } else if (bench_train->parsed()) {
      code = lab::bench_train(bopt);
    } else if (bench_sgemm->parsed()) {
      code = lab::bench_sgemm(sopt);
    } else if (bench_allreduce->parsed()) {
      code = lab::bench_allreduce(aopt);
    } else if (bench_chain->parsed()) {
      code = lab::bench_chain(copt);
    } else if (bench_layouts->parsed()) {
      code = lab::bench_layouts(layopt, lab::make_world);
    } else if (simulate_cmd->parsed()) {
      code = lab::simulate(simopt, argv[0]);
    } else if (eval_cmd->parsed()) {
      code = lab::eval_command(eopt);
    } else if (lesson_cmd->parsed()) {
      code = run_lesson_command(*lesson_cmd, lopt);
    } else if (gui_cmd->parsed()) {
      gui_cfg.bn_momentum = commands::parse_bn_momentum(gui_bn_momentum);
      commands::apply_steps_rule(*gui_cmd, gui_cfg);
      if (!gui_cfg.resume.empty()) gui_cfg = commands::resume_config(*gui_cmd, gui_cfg);  // the checkpoint's configuration
      if (gui_opt.open_dir.empty()) {  // the starting flags: refused and warned about as dtlab run's
        lab::validate(gui_cfg);
        print_warnings(gui_cfg, gui_default_config());
      }
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
