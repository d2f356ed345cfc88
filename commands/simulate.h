// dtlab simulate: collectives on 1 to 4096+ GPUs, simulated on a topology (lab/sim/topology.h)
// by the time model of lab/sim/collective_sim.h, printed as nccl-tests prints its measurements.
//
//   dtlab simulate --topology dgx-h100 --nodes 1,2,4,...,512 --collective allreduce --sizes 1K..8G
//
// Per world size, a table: size, count, type, redop, root, algorithm, time (us), algbw and busbw
// (GB/s, nccl-tests' definitions, doc/PERFORMANCE.md), then the time's split into latency,
// bandwidth and contention (us), and what NCCL's own cost model (nccl_model.h) would pick and its
// time. The fastest simulated algorithm of each size is marked '*'. The last line says how many
// collectives were simulated and in how many seconds.
//
// --json FILE: {"command": "simulate", "producer", "topology": the topology as a TOML file (text),
//   "collective", "protocol", "channels", "points": [{"nodes", "ranks", "bytes", "algorithm",
//   "time_us", "algbw_GBps", "busbw_GBps", "latency_us", "bandwidth_us", "contention_us", "steps",
//   "fastest", "nccl_choice" ("tree/LL128"; "-" under wire), "nccl_time_us"}]}
//
// --step: a training step instead of one collective, per layout as N grows (simulate_step.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "collective_sim.h"
#include "topology.h"

#include "simulate_step.h"

namespace lab {

struct SimulateOptions {
  std::string topology = "dgx-h100";  // a preset or a TOML file
  std::string nodes = "1,2,4,...,512";
  int gpus_per_node = 0;               // 0: the topology's
  std::string collective = "allreduce";
  std::string algorithms = "all";      // a list of ring, rhd, dbtree, hier; all: every one that runs the collective
  std::string protocol = "simple";
  int channels = 0;
  std::string sizes = "1K..8G";
  uint64_t step_factor = 2;
  std::string json_out;
  std::string validate;                // emulated, nccl or published: a validation table instead
  std::string dtlab;                   // validate emulated: the dtlab binary to run (default: this one)
  SimulateStepFlags step;              // --step: training steps instead of collectives (simulate_step.h)
  std::FILE* out = nullptr;            // nullptr: stdout
};

// "1,2,4,...,512": a list; "..." continues the geometric progression of the two values before it
// up to the value after it. Throws ConfigError naming `flag`.
std::vector<int> parse_int_list(const std::string& s, const std::string& flag);
// "1K..8G" (every size from 1 KiB to 8 GiB, x step_factor), "4M", "1K,64K,1M": K, M, G, T are
// powers of 1024; a size is rounded down to whole floats. Throws ConfigError naming `flag`.
std::vector<uint64_t> parse_size_list(const std::string& s, uint64_t step_factor, const std::string& flag);
// --algorithm's value: a list of ring, rhd, dbtree, hier, or all (every one). Throws ConfigError
// naming --algorithm.
std::vector<SimAlgorithm> parse_algorithm_list(const std::string& s);
// "1 KiB", "64 MiB", "8 GiB": sizes as nccl-tests' users write them.
std::string size_text(uint64_t bytes);

// The topology --topology names, with --gpus-per-node applied, checked at every node count of
// --nodes (returned in *nodes); --channels >= 0. Throws ConfigError naming the flag and its value.
Topology simulate_topology(const SimulateOptions& o, std::vector<int>* nodes);
// Every value dtlab simulate reads, checked before anything runs (a lesson's lint calls it too):
// the topology and --nodes, --sizes and --step-factor, --collective, --protocol, and each
// --algorithm named must run the collective at every node count. Throws ConfigError naming the
// flag and its value. (--step's own flags are checked by simulate_step.)
void check_simulate_options(const SimulateOptions& o);

int simulate(const SimulateOptions& o, const std::string& argv0);

}  // namespace lab
