#include "simulate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "collective_sim.h"
#include "config.h"
#include "errors.h"
#include "nccl_model.h"
#include "simulate_validate.h"
#include "topology.h"

namespace lab {

namespace {

[[noreturn]] void bad(const std::string& flag, const std::string& value, const std::string& why) {
  throw ConfigError(flag + " " + value + ": " + why);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

uint64_t parse_size(const std::string& s, const std::string& flag, const std::string& whole) {
  if (s.empty()) bad(flag, whole, "an empty size");
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) bad(flag, whole, "'" + s + "' is not a size (a number of bytes, or with K, M, G or T)");
  uint64_t v = 0;
  try {
    v = std::stoull(s.substr(0, i));
  } catch (...) {
    bad(flag, whole, "'" + s + "' is too large");
  }
  std::string unit = s.substr(i);
  if (unit.size() == 2 && (unit[1] == 'B' || unit[1] == 'b')) unit.pop_back();
  if (unit == "iB" || unit == "B" || unit == "b") unit.clear();
  uint64_t mult = 1;
  if (unit.empty()) mult = 1;
  else if (unit == "K" || unit == "k" || unit == "KiB") mult = uint64_t{1} << 10;
  else if (unit == "M" || unit == "MiB") mult = uint64_t{1} << 20;
  else if (unit == "G" || unit == "GiB") mult = uint64_t{1} << 30;
  else if (unit == "T" || unit == "TiB") mult = uint64_t{1} << 40;
  else bad(flag, whole, "'" + s + "': unknown unit '" + unit + "' (K, M, G or T: powers of 1024)");
  if (v > (uint64_t{1} << 50) / mult) bad(flag, whole, "'" + s + "' is larger than 1 PiB");
  return v * mult;
}

}  // namespace

std::vector<int> parse_int_list(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  const auto parts = split(s, ',');
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (p == "...") {
      if (out.size() < 2 || i + 1 >= parts.size())
        bad(flag, s, "'...' needs two values before it and one after it (1,2,4,...,512)");
      const int a = out[out.size() - 2], b = out.back();
      if (a <= 0 || b % a != 0 || b / a < 2)
        bad(flag, s, "'...' continues a doubling (or other whole-ratio) progression: " + std::to_string(a) + ", " +
                         std::to_string(b) + " is none");
      continue;
    }
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(p, &used);
    } catch (...) {
      used = 0;
    }
    if (used != p.size() || p.empty()) bad(flag, s, "'" + p + "' is not a whole number");
    if (v < 1 || v > (1 << 20)) bad(flag, s, std::to_string(v) + " is out of range (1 .. 1048576)");
    if (i >= 1 && parts[i - 1] == "...") {
      const long ratio = out.back() / out[out.size() - 2];
      long x = out.back();
      while (x * ratio < v) {
        x *= ratio;
        out.push_back(static_cast<int>(x));
      }
      if (x * ratio != v)
        bad(flag, s, std::to_string(v) + " is not on the progression x" + std::to_string(ratio) + " from " +
                         std::to_string(out.back()));
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

std::vector<uint64_t> parse_size_list(const std::string& s, uint64_t step_factor, const std::string& flag) {
  if (step_factor < 2) bad("--step-factor", std::to_string(step_factor), "at least 2");
  std::vector<uint64_t> out;
  for (const auto& part : split(s, ',')) {
    const size_t dots = part.find("..");
    if (dots == std::string::npos) {
      out.push_back(parse_size(part, flag, s));
      continue;
    }
    const uint64_t lo = parse_size(part.substr(0, dots), flag, s);
    const uint64_t hi = parse_size(part.substr(dots + 2), flag, s);
    if (lo == 0 || hi < lo) bad(flag, s, "a range from a size > 0 up to a size at least as large");
    for (uint64_t v = lo; v <= hi; v *= step_factor) {
      out.push_back(v);
      if (v > hi / step_factor) break;
    }
  }
  for (auto& v : out) v = v / 4 * 4;
  return out;
}

std::string size_text(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 4 && std::fmod(v, 1024) == 0) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g %s", v, units[u]);
  return buf;
}

namespace {

}  // namespace


std::vector<SimAlgorithm> parse_algorithm_list(const std::string& s) {
  if (s == "all") return {SimAlgorithm::Ring, SimAlgorithm::Rhd, SimAlgorithm::DbTree, SimAlgorithm::Hier};
  std::vector<SimAlgorithm> out;
  for (const auto& a : split(s, ',')) out.push_back(parse_sim_algorithm(a));
  return out;
}

Topology simulate_topology(const SimulateOptions& o, std::vector<int>* nodes) {
  Topology base = topology_from_arg(o.topology);
  if (o.gpus_per_node < 0) bad("--gpus-per-node", std::to_string(o.gpus_per_node), "at least 1 (0: the topology's)");
  if (o.gpus_per_node > 0) base.gpus_per_node = o.gpus_per_node;
  if (o.channels < 0) bad("--channels", std::to_string(o.channels), "at least 1 (0: two per NIC)");
  *nodes = parse_int_list(o.nodes, "--nodes");
  for (int nn : *nodes) {
    Topology t = base;
    t.nodes = nn;
    validate_topology(t, "--topology " + o.topology + " with --nodes " + std::to_string(nn));
  }
  return base;
}

void check_simulate_options(const SimulateOptions& o) {
  std::vector<int> nodes;
  const Topology base = simulate_topology(o, &nodes);
  if (o.step.on) return check_simulate_step_options(o);
  {  // a flag of --step without --step would be ignored: say so
    const SimulateStepFlags& f = o.step;
    const char* stray = f.gpu_tflops > 0           ? "--gpu-tflops"
                        : !f.compute_from.empty()  ? "--compute-from"
                        : f.params > 0             ? "--params"
                        : !f.layouts.empty()       ? "--layouts"
                        : !f.model.empty()         ? "--model"
                        : f.mode != "ddp"          ? "--mode"
                                                   : nullptr;
    if (stray) throw ConfigError(std::string(stray) + " is a flag of dtlab simulate --step (a training step); add --step");
  }
  parse_size_list(o.sizes, o.step_factor, "--sizes");
  const SimCollective coll = parse_sim_collective(o.collective);
  parse_sim_protocol(o.protocol);
  if (o.algorithms == "all") return;
  // an algorithm named must run the collective at every node count (all: each one that does)
  for (const SimAlgorithm a : parse_algorithm_list(o.algorithms)) {
    std::string why, where;
    size_t refused = 0;
    for (int nn : nodes) {
      const int ranks = nn * base.gpus_per_node;
      std::string w;
      if (sim_supports(a, coll, ranks, &w)) continue;
      if (refused++ == 0) {
        why = w;
        where = " on " + std::to_string(nn) + " node" + (nn == 1 ? "" : "s") + " (" + std::to_string(ranks) + " GPUs)";
      }
    }
    if (refused > 0)  // where: only when it runs at some node counts and not at others
      throw ConfigError(std::string("--algorithm ") + sim_algorithm_name(a) + " with --collective " +
                            sim_collective_name(coll) + (refused < nodes.size() ? where : "") + ": " + why,
                        "name only algorithms that run the collective (or --algorithm all: each that does)");
  }
}

int simulate(const SimulateOptions& o, const std::string& argv0) {
  if (!o.validate.empty()) return simulate_validate(o, argv0);
  if (o.step.on) return simulate_step(o);
  check_simulate_options(o);
  std::FILE* out = o.out ? o.out : stdout;
  std::vector<int> nodes;
  const Topology base = simulate_topology(o, &nodes);
  const std::vector<uint64_t> sizes = parse_size_list(o.sizes, o.step_factor, "--sizes");
  const SimCollective coll = parse_sim_collective(o.collective);
  const SimProtocol proto = parse_sim_protocol(o.protocol);
  const std::vector<SimAlgorithm> algos = parse_algorithm_list(o.algorithms);

  nlohmann::json points = nlohmann::json::array();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t simulated = 0;
  std::fprintf(out, "# dtlab simulate: %s, protocol %s\n", sim_collective_name(coll), sim_protocol_name(proto));
  std::fprintf(out, "# time = latency + bandwidth + contention (us); busbw = algbw x %s (nccl-tests)\n",
               coll == SimCollective::Allreduce ? "2(N-1)/N" : coll == SimCollective::Broadcast ? "1" : "(N-1)/N");
  for (int nn : nodes) {
    Topology t = base;
    t.nodes = nn;
    const int n = t.ranks();
    SimOptions so;
    so.collective = coll;
    so.protocol = proto;
    so.channels = o.channels;
    const int channels = o.channels > 0 ? o.channels : sim_default_channels(t, proto);
    std::vector<SimAlgorithm> run;
    for (auto a : algos)
      if (sim_supports(a, coll, n)) run.push_back(a);
    std::fprintf(out, "#\n# %s\n", topology_line(t).c_str());
    std::fprintf(out, "# %d ranks, %d channel%s\n", n, channels, channels == 1 ? "" : "s");
    std::fprintf(out, "# %12s %12s %6s %5s %5s %9s %12s %11s %11s %11s %11s %11s  %-14s %11s\n", "size", "count",
                 "type", "redop", "root", "algorithm", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "lat(us)", "bw(us)",
                 "cont(us)", "nccl picks", "nccl(us)");
    const NcclModelInputs nin = sim_nccl_inputs(t, channels);
    for (uint64_t bytes : sizes) {
      std::vector<SimResult> res;
      for (auto a : run) {
        so.algorithm = a;
        res.push_back(simulate_collective(t, so, bytes));
        ++simulated;
      }
      size_t best = 0;
      for (size_t i = 1; i < res.size(); ++i)
        if (res[i].time_s < res[best].time_s) best = i;
      std::string pick = "-";
      double nccl_us = 0;
      if (proto != SimProtocol::Wire && n > 1) {
        const NcclEstimate e = nccl_choice(nin, sim_nccl_coll(coll), static_cast<double>(bytes));
        pick = std::string(nccl_algo_name(e.algo)) + "/" + nccl_proto_name(e.proto);
        nccl_us = e.time_us;
      }
      for (size_t i = 0; i < res.size(); ++i) {
        const SimResult& r = res[i];
        std::fprintf(out, "  %12llu %12llu %6s %5s %5s %8s%c %12.2f %11.2f %11.2f %11.2f %11.2f %11.2f  %-14s %11.2f\n",
                     static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(bytes / 4), "float",
                     coll == SimCollective::Broadcast ? "none" : "sum", coll == SimCollective::Broadcast ? "0" : "-1",
                     sim_algorithm_name(run[i]), i == best && res.size() > 1 ? '*' : ' ', r.time_s * 1e6,
                     r.algbw / 1e9, r.busbw / 1e9, r.latency_s * 1e6, r.bandwidth_s * 1e6, r.contention_s * 1e6,
                     i == 0 ? pick.c_str() : "", i == 0 ? nccl_us : 0.0);
        points.push_back({{"nodes", nn},
                          {"ranks", n},
                          {"bytes", bytes},
                          {"algorithm", sim_algorithm_name(run[i])},
                          {"time_us", r.time_s * 1e6},
                          {"algbw_GBps", r.algbw / 1e9},
                          {"busbw_GBps", r.busbw / 1e9},
                          {"latency_us", r.latency_s * 1e6},
                          {"bandwidth_us", r.bandwidth_s * 1e6},
                          {"contention_us", r.contention_s * 1e6},
                          {"steps", r.steps},
                          {"fastest", i == best},
                          {"nccl_choice", pick},
                          {"nccl_time_us", nccl_us}});
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.json_out.empty()) {
    nlohmann::json j = {{"command", "simulate"},
                        {"producer", std::string("dtlab ") + kDtlabVersion},
                        {"topology", topology_toml(base)},
                        {"collective", sim_collective_name(coll)},
                        {"protocol", sim_protocol_name(proto)},
                        {"channels", o.channels},
                        {"points", points}};
    std::ofstream f(o.json_out);
    if (!f) throw IoError("--json " + o.json_out + ": cannot write the file");
    f << j.dump(1) << "\n";
    if (!f) throw IoError("--json " + o.json_out + ": cannot write the file");
  }
  std::fprintf(out, "# simulated %lld collectives over %zu world sizes and %zu sizes in %.2f s\n",
               static_cast<long long>(simulated), nodes.size(), sizes.size(), secs);
  return kExitOk;
}

}  // namespace lab
