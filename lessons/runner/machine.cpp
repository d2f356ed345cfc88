#include "machine.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

namespace lessons {

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::atomic<double> g_sink{0};

// Arithmetic steps done until `deadline` (8 independent chains keep one core's floating-point
// units busy; nothing touches memory, so two cores never wait for each other).
double spin_until(double deadline) {
  double x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  double steps = 0;
  do {
    for (int r = 0; r < 2048; ++r)
      for (double& v : x) v = v * 0.9999999 + 1e-7;
    steps += 2048;
  } while (now() < deadline);
  double s = 0;
  for (double v : x) s += v;
  g_sink = g_sink + s;  // keeps the loop
  return steps;
}

}  // namespace

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

double two_thread_scaling(int attempts, double seconds) {
  double best1 = 0, best2 = 0;
  for (int a = 0; a < attempts; ++a) {
    double t0 = now();
    best1 = std::max(best1, spin_until(t0 + seconds) / (now() - t0));
    // two threads from one start to one deadline: on one core they share it and add up to one
    double other = 0;
    t0 = now();
    std::thread helper([&] { other = spin_until(t0 + seconds); });
    const double mine = spin_until(t0 + seconds);
    helper.join();
    best2 = std::max(best2, (mine + other) / (now() - t0));
  }
  return best1 > 0 ? best2 / best1 : 0;
}

std::string two_idle_cores_missing() {
  const int cores = usable_cores();
  if (cores < 2)
    return "the lesson times work spread over 2 cores, and this process may use " + std::to_string(cores) +
           " (its CPU affinity: taskset -c, a container's cpuset)";
  const double s = two_thread_scaling();
  if (s < kIdleTwoThreadScaling) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "the lesson times work spread over 2 idle cores, and two threads of arithmetic ran only %.2fx as fast "
                  "as one here (idle cores: %.1fx or more): another program is using a core, or the two are "
                  "hyperthreads of one core; run it again when the machine is idle",
                  s, kIdleTwoThreadScaling);
    return buf;
  }
  return "";
}

}  // namespace lessons
