// dtlab simulate --step: training steps at scale (lab/sim/step_sim.h), per layout as N grows: where
// communication overtakes compute.
//
//   dtlab simulate --step --model cnn --mode ddp --gpu-tflops 100 --topology dgx-h100 --nodes 1,2,4,...,512
//   dtlab simulate --step --params 7e9 --flops-per-sample 8.6e13 --layers 32 --activation-bytes 16.8e6
//                  --grad-bytes 2 --global-batch 1024 --layouts all --gpu-tflops 400
//
// One table per layout (its pp and tp fixed, dp = N / (pp tp) growing with the nodes): per node count
// the compute, the pipeline's bubble, each axis' communication (dp, pp, tp: seconds on the busiest
// rank, hidden or not), the exposed communication, the optimizer, the step, samples per second, and
// exposed / compute. The last line names, per layout, the first N where the exposed communication
// exceeds the compute (or "not up to N").
//
// --json FILE: {"command": "simulate --step", "topology": {...}, "model": {"name", "describe",
//   "parameters", "flops_per_sample", "grad_bytes"}, "compute": {"tflops" | "source", ...},
//   "config": {...}, "layouts": [{"pp", "tp", "mode", "points": [{"nodes", "ranks", "dp",
//   "refused", "batch_per_replica", "microbatches", "compute_ms", "bubble_ms", "dp_ms", "pp_ms",
//   "tp_ms", "exposed_ms", "optimizer_ms", "step_ms", "samples_per_s", "dp_bytes", "pp_bytes",
//   "tp_bytes", "broadcast_ms", "dp_algorithms", "tp_algorithms", "notes"}], "overtakes_at_ranks": N or null}]}
#pragma once

#include <cstdint>
#include <string>

namespace lab {

struct SimulateOptions;

// The flags of --step (add_simulate_flags defines them; they live in SimulateOptions::step).
struct SimulateStepFlags {
  bool on = false;                 // --step
  std::string model;               // mlp, cnn or generic ("": cnn; generic with --params; the run's with --compute-from)
  double params = 0;               // generic
  double flops_per_sample = 0;     // generic
  int layers = 1;                  // generic
  double activation_bytes = 0;     // generic, per sample per layer boundary
  double grad_bytes = 4;           // generic: bytes per gradient element (dtlab's float32; 2 for bf16)
  int64_t global_batch = 4096;
  std::string mode = "ddp";        // ddp, zero, fsdp, pipeline, tensor
  int dp = 0, pp = 0, tp = 0;      // 0: the mode's (dp: the rest of N)
  std::string layouts;             // all: every dp x pp x tp of each N
  int microbatches = 0;            // 0: 4 x pp
  std::string schedule = "1f1b";
  double bucket_cap_mb = 25;
  bool no_overlap = false;
  bool no_broadcast_buffers = false;
  double gpu_tflops = 0;
  std::string compute_from;        // a dtlab run directory
};

// Throws ConfigError, naming the flag, for --step's flags that cannot run (those that need no file:
// whether --compute-from's run trained --model is found when it is read).
void check_simulate_step_options(const SimulateOptions& o);
// Runs --step with the simulate command's topology, nodes, protocol, algorithms, channels and --json.
int simulate_step(const SimulateOptions& o);

}  // namespace lab
