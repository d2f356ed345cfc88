#include "lesson_runs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "backends.h"
#include "bench_allreduce.h"
#include "bench_chain.h"
#include "bench_train.h"
#include "command_line.h"
#include "errors.h"
#include "eval_command.h"
#include "events.h"
#include "simulate.h"

namespace lessons {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

// The exit code, error and hint main() would give for an exception.
void describe_error(std::exception_ptr ep, RunOutcome& o) {
  try {
    std::rethrow_exception(ep);
  } catch (const lab::Error& e) {
    o.exit_code = e.exit_code();
    o.error = e.what();
    o.hint = e.hint();
  } catch (const std::exception& e) {
    o.exit_code = lab::kExitFailure;
    o.error = std::string("internal error: ") + e.what();
  }
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Ranks as processes: `mpirun -np N ... dtlab run ARGS`, its output in <dir>/output.txt. The
// error and hint are rank 0's lines as main() prints them.
void run_under_mpirun(const commands::CommandSpec& spec, const std::vector<std::string>& args, const std::string& dir,
                      RunOutcome& o) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) throw lab::Error("cannot find the dtlab executable (/proc/self/exe)");
  exe[n] = 0;
  std::string cmd = "mpirun -np " + std::to_string(spec.run.world_size) + " --oversubscribe";
  if (geteuid() == 0) cmd += " --allow-run-as-root";
  // mpirun's own limit, beyond the lab's collective timeout: a hung job cannot hang the lesson
  cmd += " --timeout " + std::to_string(static_cast<int>(spec.run.timeout_s * 4 + 120));
  cmd += " " + shell_quote(exe) + " run";
  for (const std::string& a : args) cmd += " " + shell_quote(a);
  const std::string out = dir + "/output.txt";
  cmd += " > " + shell_quote(out) + " 2>&1";
  const int status = std::system(cmd.c_str());
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : lab::kExitFailure;
  std::ifstream f(out);
  std::string line;
  while (std::getline(f, line)) {
    if (o.error.empty() && line.rfind("dtlab: error: ", 0) == 0) o.error = line.substr(14);
    else if (!o.error.empty() && o.hint.empty() && line.rfind("  hint: ", 0) == 0) o.hint = line.substr(8);
  }
  if (o.exit_code != 0 && o.error.empty()) o.error = "mpirun ended with exit code " + std::to_string(o.exit_code) + " (see " + out + ")";
}

}  // namespace

RunOutcome outcome_of(const RunSpec& spec, const std::vector<std::string>& args, const std::string& dir, int exit_code,
                      const std::string& error, const std::string& hint, double seconds) {
  RunOutcome o;
  o.name = spec.name;
  o.command = spec.command;
  o.args = args;
  o.dir = dir;
  o.exit_code = exit_code;
  o.error = error;
  o.hint = hint;
  o.seconds = seconds;
  return o;
}

RunOutcome execute_run(const RunSpec& spec, const std::vector<std::string>& args, const std::string& dir,
                       const ExecHooks& hooks) {
  RunOutcome o = outcome_of(spec, args, dir, 0, "", "", 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // a run directory holds one run
  std::filesystem::create_directories(dir, ec);
  if (ec) throw lab::IoError("cannot create " + dir + ": " + ec.message());
  const double t0 = lab::now_seconds();
  try {
    commands::CommandSpec cmd = commands::parse_command(spec.command, args);
    if (spec.command == "run" && cmd.run.comm == "mpi") {
      run_under_mpirun(cmd, args, dir, o);
    } else if (spec.command == "run") {
      lab::Run run(cmd.run, lab::make_world);
      bool stopped = false;
      run.run([&](const lab::Snapshot& s) {
        if (hooks.stop && hooks.stop->load() && !stopped) {
          run.control().stop();
          stopped = true;
        }
        if (hooks.on_progress) hooks.on_progress(s);
      });
      if (stopped) {
        o.exit_code = lab::kExitInterrupted;
        o.error = "interrupted";
      }
    } else {
      std::unique_ptr<std::FILE, FileCloser> out(std::fopen((dir + "/output.txt").c_str(), "w"));
      if (!out) throw lab::IoError("cannot write " + dir + "/output.txt: " + std::strerror(errno));
      if (spec.command == "bench train") {
        cmd.bench_train.out = out.get();
        o.exit_code = lab::bench_train(cmd.bench_train);
      } else if (spec.command == "bench sgemm") {
        cmd.bench_sgemm.out = out.get();
        o.exit_code = lab::bench_sgemm(cmd.bench_sgemm);
      } else if (spec.command == "bench allreduce") {
        cmd.bench_allreduce.out = out.get();
        o.exit_code = lab::bench_allreduce(cmd.bench_allreduce);
      } else if (spec.command == "bench chain") {
        cmd.bench_chain.out = out.get();
        o.exit_code = lab::bench_chain(cmd.bench_chain);
      } else if (spec.command == "eval") {
        cmd.eval.out = out.get();
        o.exit_code = lab::eval_command(cmd.eval);
      } else if (spec.command == "simulate") {
        cmd.simulate.out = out.get();
        o.exit_code = lab::simulate(cmd.simulate, "dtlab");  // argv0 serves --validate only, which a lesson refuses
      }
    }
  } catch (...) {
    describe_error(std::current_exception(), o);
  }
  o.seconds = lab::now_seconds() - t0;
  write_outcome(o);
  return o;
}

}  // namespace lessons
