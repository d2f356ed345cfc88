// The rounds of a benchmark (bench train, sgemm, chain), and what they say about the machine:
//   - the figure is the median round; the noise is the rounds' spread;
//   - the contention is the CPU time other programs took from the cores the benchmark needed
//     while it timed (a core that another program keeps busy slows a 2-thread benchmark without
//     making its rounds disagree, so the spread alone cannot see it).
// A lesson reads both from the bench JSON ("noise", "contention") in the quiet_if of its timing
// checks (lessons/README.md, section 7): a speed claim is judged only on a quiet machine.
#pragma once

#include <sched.h>

#include <vector>

namespace lab {

struct RoundTimes {
  double median = 0;      // seconds per call in the median round
  double noise = 0;       // (slowest round - fastest round) / median: a few percent on an idle
                          // core, tens of percent when other programs take the core now and then
  double contention = 0;  // Contention::cores() over the rounds (-1: unknown)
};

// ts: seconds per call of each round (at least one).
RoundTimes round_times(std::vector<double> ts);

// CPU time other programs spent on the cores this process may use, from construction to
// cores(): the busy time of those cores (/proc/stat, per CPU) minus this process's own CPU time
// (getrusage: all its threads, ended ones included), per second of wall clock.
class Contention {
 public:
  // `threads`: how many cores the benchmark keeps busy (capped at the cores it may use).
  explicit Contention(int threads);
  // Cores' worth of CPU time other programs took beyond the cores the benchmark left free: 0 on a
  // quiet machine (or when others ran only on cores it did not need), about 1 when another
  // program kept one of its cores busy throughout. Resolution: the kernel's accounting tick,
  // about 0.02 / seconds measured per core. -1 where /proc/stat cannot be read.
  double cores() const;

 private:
  struct Sample {
    double busy = 0;  // seconds the cores of the mask were busy (all programs)
    double self = 0;  // seconds of CPU this process used
    double wall = 0;
    bool ok = false;
  };
  Sample sample() const;
  cpu_set_t m_mask;
  int m_cpus = 0;     // cores in the mask
  int m_needed = 0;   // cores the benchmark keeps busy
  Sample m_start;
};

}  // namespace lab
