// What this machine offers a lesson about cores, measured when the lesson runs (the "2-cores"
// requirement, lessons/README.md): how many cores this process may run on, and whether two of
// them are idle now. A lesson that times two threads against one makes a claim about two idle
// cores; on a machine whose second core is busy (another program, a build, a test running beside
// it) or that gives the process one core (taskset -c 0, a container's cpuset or CPU quota) that
// claim cannot be judged, so the lesson is skipped with the reason instead of failing.
#pragma once

#include <string>

namespace lessons {

// The cores this process may run on: its CPU affinity mask (taskset, cpusets); the machine's
// count where the mask cannot be read.
int usable_cores();

// Two threads of pure arithmetic (no memory traffic) against one: the work both do together in
// the same wall-clock time, over the work one does alone. About 2 on two idle cores; about 1 on
// one core (or with the second busy); 1.2 to 1.6 for two hyperthreads of one core. The best
// single-thread rate and the best two-thread rate of `attempts` alternating tries of `seconds`
// each: a blip in one try cannot make a busy machine look idle, nor an idle one busy.
double two_thread_scaling(int attempts = 3, double seconds = 0.04);

// Two idle cores reach at least this scaling in two_thread_scaling().
constexpr double kIdleTwoThreadScaling = 1.8;

// "" when the process may use two cores and two are idle now; else why not, with the numbers.
std::string two_idle_cores_missing();

}  // namespace lessons
