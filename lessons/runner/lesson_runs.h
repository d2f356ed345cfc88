// Executing a lesson's run: `dtlab run`, `dtlab bench ...`, `dtlab eval` or `dtlab simulate` in this process, with
// the options the CLI parses from the same arguments, ending the way the CLI would (the exit
// code main() would return, the error and hint it would print). A run with --comm mpi is started
// under mpirun as separate processes. Each run leaves outcome.json in its directory; bench, eval
// and simulate write their tables to output.txt and their figures to result.json there.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "lesson.h"
#include "quantity.h"
#include "run.h"

namespace lessons {

struct ExecHooks {
  // Called about every 100 ms while a training run trains (on the executing thread).
  std::function<void(const lab::Snapshot&)> on_progress;
  // When it becomes true the run stops at its next gate and ends as interrupted (exit 130).
  const std::atomic<bool>* stop = nullptr;
};

// Runs `spec` with `args` (Session::concrete_args: placeholders replaced, output flags added)
// into `dir`, writes <dir>/outcome.json and returns how it ended. Never throws for the run's own
// failure (that is the outcome); throws lab::IoError if the directory cannot be written.
RunOutcome execute_run(const RunSpec& spec, const std::vector<std::string>& args, const std::string& dir,
                       const ExecHooks& hooks = {});

// How a training run driven elsewhere (the app's run host) ended, as an outcome.
RunOutcome outcome_of(const RunSpec& spec, const std::vector<std::string>& args, const std::string& dir, int exit_code,
                      const std::string& error, const std::string& hint, double seconds);

}  // namespace lessons
