// The flags of every dtlab command that trains or measures, defined once. main.cpp builds the
// command line from these functions, and a lesson's runs are parsed by parse_command() from the
// same definitions, so a lesson can only use flags that `dtlab run` / `dtlab bench` / `dtlab eval`
// accept, with the same defaults and checks (lessons/README.md).
#pragma once

#include <optional>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_allreduce.h"
#include "bench_chain.h"
#include "bench_layouts.h"
#include "bench_train.h"
#include "config.h"
#include "eval_command.h"
#include "simulate.h"

namespace commands {

// --device, --allow-tf32, --cudnn-benchmark, --cudnn-deterministic (device.h), for run and bench train.
// has_comm: the command has --comm (run, gui), so --rank-devices may mention NCCL.
void add_compute_flags(CLI::App& app, lab::ComputeOptions& o, bool has_comm = true);
// `dtlab run` (and `dtlab gui`, whose starting configuration they are). bn_momentum is parsed
// after the command line by parse_bn_momentum ("none" or a number).
void add_run_flags(CLI::App& app, lab::RunConfig& c, std::string& bn_momentum);
std::optional<double> parse_bn_momentum(const std::string& s);
// --steps without --epochs: as many epochs as the steps take (epochs 0). With both, the run ends
// at whichever limit it reaches first (Run). --stages (--tp) without --world-size: one rank per stage
// (per slice).
void apply_steps_rule(const CLI::App& app, lab::RunConfig& c);
// `dtlab run --resume DIR`: the configuration of DIR's newest committed checkpoint, with the
// flags a resumed run may change taken from `given` (--out, --timeout, --threads, --comm,
// --world-size, --data-dir, --checkpoint-every, --checkpoint-every-epoch). Any other flag on
// the command line (app.count > 0) is a ConfigError naming it. Validated.
// `stand_in`: the configuration the checkpoint will have (a lesson's lint, before any run exists);
// null: read from DIR's newest committed checkpoint. Options of app that are not run flags (the
// app's own, e.g. dtlab gui's --screenshot) are not checked.
lab::RunConfig resume_config(const CLI::App& app, const lab::RunConfig& given, const lab::RunConfig* stand_in = nullptr);

void add_bench_train_flags(CLI::App& app, lab::BenchTrainOptions& o);
void add_bench_sgemm_flags(CLI::App& app, lab::BenchSgemmOptions& o);
void add_bench_allreduce_flags(CLI::App& app, lab::BenchAllreduceOptions& o);
void add_bench_chain_flags(CLI::App& app, lab::BenchChainOptions& o);
void add_bench_layouts_flags(CLI::App& app, lab::BenchLayoutsOptions& o);
// `dtlab simulate` (commands/simulate.h).
void add_simulate_flags(CLI::App& app, lab::SimulateOptions& o);
void add_eval_flags(CLI::App& app, lab::EvalCommandOptions& o);

// A command a lesson (or a script) runs: its name, its arguments as given, and its options as
// the CLI parses them. Exactly one of the option structs is meaningful, the one `command` names.
struct CommandSpec {
  std::string command;              // "run", "bench train", "bench sgemm", "bench allreduce", "bench chain", "eval", "simulate"
  std::vector<std::string> args;    // the flags, as a user would type them after the command
  lab::RunConfig run;               // with bn_momentum resolved; validated (lab::validate)
  bool world_size_given = false;    // run: --world-size was on the command line
  lab::BenchTrainOptions bench_train;
  lab::BenchSgemmOptions bench_sgemm;
  lab::BenchAllreduceOptions bench_allreduce;
  lab::BenchChainOptions bench_chain;
  lab::EvalCommandOptions eval;
  lab::SimulateOptions simulate;    // its values checked as dtlab simulate would check them (lab::check_simulate_options)
};

// The commands parse_command knows, in the order `dtlab lesson` documents them.
const std::vector<std::string>& lesson_commands();

// Parses `dtlab <command> <args...>` with the CLI's own definitions. Throws lab::ConfigError with
// CLI11's message ("--wrld-size: unknown flag", "--batch-size: Value 'x' could not be converted")
// or lab::validate's (for run). `--help` is refused (it would print and stop).
// resume_stand_in (a lesson's lint): for `run --resume DIR`, the configuration DIR's checkpoint
// will hold, or null to read it from DIR.
CommandSpec parse_command(const std::string& command, const std::vector<std::string>& args,
                          const std::function<const lab::RunConfig*(const std::string&)>& resume_stand_in = {});

// "unknown flag --no-sync-step (did you mean --no-sync-steps?)" for the first word of args that
// looks like a flag app does not have; "" when there is none.
std::string unknown_flag_message(const CLI::App& app, const std::vector<std::string>& args);
// "unknown command 'dtlab rn' (did you mean dtlab run?); the commands are: run, bench, ..." for
// the first word of args (the words after the program's name) that is not a subcommand where one
// is expected; "" when every command word is known.
std::string unknown_command_message(const CLI::App& app, const std::vector<std::string>& args);
// The closest of `known` to `name` within max_distance edits (or a word name begins), else "".
std::string closest(const std::string& name, const std::vector<std::string>& known, size_t max_distance);

// The command as one shell line (words with spaces or quotes are quoted): "dtlab run --model mlp".
std::string command_line(const std::string& command, const std::vector<std::string>& args);
// Splits a lesson's args string into words, as a POSIX shell would for plain words, 'single' and
// "double" quotes and backslash escapes (no variables, globs or substitutions). Throws
// lab::ConfigError for an unterminated quote.
std::vector<std::string> split_args(const std::string& text);

// Writes a command's --json result (pretty-printed, newline at the end); throws lab::IoError
// naming the file.
void write_result_json(const std::string& path, const nlohmann::json& j);

}  // namespace commands

namespace lab {
using commands::write_result_json;
}
