// The progress line `dtlab run` redraws on a terminal. While iterations finish it shows the step,
// the loss, the accuracy and the samples per second; when none has finished for a while (a rank
// hung, a peer vanished, a slow collective) it stops showing a rate that only falls and says what
// the run waits for instead: how long, for which iteration, and (under MPI) for which rank.
#pragma once

#include <cstdint>
#include <string>

#include "run.h"

namespace commands {

class ProgressLine {
 public:
  // Seconds without a finished iteration before the line says the run is waiting.
  static constexpr double kStallSeconds = 2.0;

  // The line for snapshot s at time `now` (seconds, any steady clock), without the terminal's
  // carriage return. waiting_for: the rank this process waits for (-1: unknown);
  // timeout_s: --timeout.
  std::string line(const lab::Snapshot& s, double now, int waiting_for, double timeout_s);

 private:
  int64_t m_done = -1;   // iterations done at the last change
  double m_since = 0;    // when that count was first seen
};

// What the run directory keeps after a run that stopped early (Ctrl-C twice, a vanished MPI peer):
// its newest intact checkpoint and the command that continues it (under mpirun when the ranks
// are processes), or why there is none.
std::string what_the_run_directory_keeps(const lab::RunConfig& c, bool ranks_are_processes);

}  // namespace commands
