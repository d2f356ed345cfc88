#include "command_line.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "errors.h"

namespace cli {

// Parallelism modes and communication behaviour.
namespace {

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

}  // namespace

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


void add_bench_train_flags(CLI::App& app, lab::BenchTrainOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", o.model, "mlp or cnn")->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "per-rank batch size")->capture_default_str();
  app.add_option("--world-size", o.world_size, "emulated ranks (DDP with ring allreduce)")->capture_default_str();
  app.add_option("--threads", o.threads, "BLAS threads for one rank (ranks use one each)")->capture_default_str();
  app.add_option("--seconds", o.seconds, "target seconds per timing round")->capture_default_str();
  app.add_option("--rounds", o.rounds, "timing rounds (the median is reported)")->capture_default_str();
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
  app.add_option("--timeout", o.timeout_s, "seconds a rank may wait before the benchmark fails")->capture_default_str();
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
  app.add_option("--limit-test", o.limit_test, "use only the first N test samples (0: all)")->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "directory of the Fashion-MNIST .gz files (default: the run's, else the "
                                           "Debian package's)");
  app.add_option("--probe", o.probe, "report the softmax outputs of the first K test samples")->capture_default_str();
  app.add_option("--threads", o.threads, "compute threads (0: one per core)")->capture_default_str();
  app.add_option("--json", o.json_out, "also write every figure (and every sample's prediction) as JSON");
}

const std::vector<std::string>& lesson_commands() {
  static const std::vector<std::string> k = {"run", "bench train", "bench sgemm", "bench allreduce", "eval"};
  return k;
}

CommandSpec parse_command(const std::string& command, const std::vector<std::string>& args) {
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
  else if (command == "eval") add_eval_flags(app, spec.eval);
  else {
    std::string known;
    for (const std::string& c : lesson_commands()) known += (known.empty() ? "" : ", ") + c;
    throw lab::ConfigError("unknown command '" + command + "'", "a lesson's run uses one of: " + known);
  }
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    if (what.empty()) what = e.get_name();
    throw lab::ConfigError("dtlab " + command + ": " + what);
  }
  if (command == "run") {
    spec.run.bn_momentum = parse_bn_momentum(bn_momentum);
    spec.world_size_given = app.count("--world-size") > 0;
    lab::validate(spec.run);
  }
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

}  // namespace cli
