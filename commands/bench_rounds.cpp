#include "bench_rounds.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "events.h"

namespace lab {

RoundTimes round_times(std::vector<double> ts) {
  assert(!ts.empty());
  std::sort(ts.begin(), ts.end());
  RoundTimes r;
  r.median = ts[ts.size() / 2];
  r.noise = r.median > 0 ? (ts.back() - ts.front()) / r.median : 0;
  return r;
}

Contention::Contention(int threads) {
  CPU_ZERO(&m_mask);
  if (sched_getaffinity(0, sizeof m_mask, &m_mask) != 0) CPU_ZERO(&m_mask);
  m_cpus = CPU_COUNT(&m_mask);
  m_needed = std::min(std::max(1, threads), std::max(1, m_cpus));
  m_start = sample();
}

Contention::Sample Contention::sample() const {
  Sample s;
  s.wall = now_seconds();
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0)
    s.self = static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
  std::ifstream f("/proc/stat");
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (!f || m_cpus == 0 || tick <= 0) return s;
  std::string line;
  int seen = 0;
  while (std::getline(f, line)) {
    // "cpuN user nice system idle iowait irq softirq steal guest guest_nice" (guest is in user)
    if (line.compare(0, 3, "cpu") != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream in(line.substr(3));
    int cpu = -1;
    unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (!in || cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &m_mask)) continue;
    s.busy += static_cast<double>(user + nice + system + irq + softirq + steal) / tick;
    ++seen;
  }
  s.ok = seen == m_cpus;
  return s;
}

double Contention::cores() const {
  const Sample end = sample();
  if (!m_start.ok || !end.ok || end.wall <= m_start.wall) return -1;
  const double others = std::max(0.0, (end.busy - m_start.busy) - (end.self - m_start.self)) / (end.wall - m_start.wall);
  return std::max(0.0, others - (m_cpus - m_needed));
}

}  // namespace lab
