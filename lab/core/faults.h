// Failures on purpose (--fail-rank R --fail-step S --fail-at WHERE), to show what a failing rank
// does to the world: the plan says where, and each place asks it. Where a rank fails:
//   forward    before the iteration's forward (the rank loop, every mode)
//   hang       the rank stops answering at the start of the iteration (the rank loop)
//   backward   in backward, at the first gradient (the mode's step: DDP's first ready hook,
//              DataParallel's device before its backward, a worker after its backward)
//   nan        a NaN enters the rank's loss gradient (modes with caps().skip_step)
//   allreduce  before ring step 1 of the iteration's first gradient bucket (the run's ring gate)
#pragma once

#include <cstdint>
#include <string>

#include "config.h"
#include "errors.h"

namespace lab {

// Thrown by a failure on purpose: a training error like any other to the rest of the run.
class InjectedFailure : public TrainingError {
 public:
  using TrainingError::TrainingError;
};

// Thrown at a gate after RunControl::stop(), or by a rank that waits to be stopped (a hung rank,
// a rank out of data): unwinds the rank without being reported as a failure.
struct StopRequested {};

struct FaultPlan {
  int rank = -1;          // -1: no failure
  int64_t step = 0;
  std::string at;         // forward | backward | allreduce | hang | nan

  static FaultPlan from(const RunConfig& c) { return FaultPlan{c.fail_rank, c.fail_step < 0 ? 0 : c.fail_step, c.fail_at}; }
  // This rank fails at `where` in iteration `s`.
  bool here(int r, int64_t s, const char* where) const { return r == rank && s == step && at == where; }
  // Throws InjectedFailure when this rank fails at `where` in iteration `s`.
  void check(int r, int64_t s, const char* where) const {
    if (here(r, s, where)) throw InjectedFailure(std::string("injected failure ") + message(where));
  }

 private:
  static std::string message(const char* where) {
    const std::string w = where;
    if (w == "forward") return "before forward (--fail-at forward)";
    if (w == "backward") return "in backward (--fail-at backward)";
    return "at " + w + " (--fail-at " + w + ")";
  }
};

}  // namespace lab
