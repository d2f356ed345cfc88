// dtlab bench layouts: "which layout for my model and my network?" Every way to place N ranks on
// the grid of data, pipeline and tensor parallelism (dp x pp x tp = N, Megatron-LM's placement),
// trained on the same global batch over the same link (--link-gbps, --link-latency-us: the
// simulated switch of lab/comm/link_model.h), measured, not guessed.
//
// A layout is run as the mode that has its axes: dp only, DDP on N ranks (--batch-size G/N per
// rank); tensor parallelism (tp > 1, pp 1), --mode tensor --tp T --dp D; a pipeline (pp > 1),
// --mode pipeline --pp P --tp T --dp D with --microbatches M (at most the replica's batch G/D).
// A layout the lab refuses (a --tp that does not divide a split layer, more stages than layers
// with matrix products, a global batch that the replicas cannot share evenly) is listed with the
// refusal's words.
//
// Per layout, from the run's trace: the time of an iteration (the span from the first event of
// the iteration on any rank to the last one's end; the median over the iterations after the first,
// which warms up), the bytes each kind of group carried per iteration (summed over the ranks), the
// most bytes one rank sent per iteration and the time the link needs for them (that rank's link
// out is busy at least that long: a lower bound the layout cannot beat on this network, whatever
// the compute). On a laptop the ranks share its cores, so the compute part of the time is not a
// GPU's: the bytes and the wire's lower bound are the layout's wherever it runs.
//
// The table is sorted by time; the last line is `ratio slowest/fastest layout <x>`.
// --json: {"command": "bench layouts", "producer", "model", "world_size", "global_batch",
//   "link": {"gbps", "latency_us"}, "layouts": [{"dp", "pp", "tp", "mode", "batch_size",
//   "microbatches", "refused" (empty when it ran), "ms_per_iteration", "bytes_per_iteration_by_group":
//   {"dp", "pp", "tp"}, "busiest_rank", "busiest_rank_bytes", "wire_ms"}], "fastest", "ratio_slowest_fastest"}
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "run.h"

namespace lab {

struct BenchLayoutsOptions {
  RunConfig base;             // model, data, seed, optimizer, link; world_size is N
  int64_t global_batch = 64;  // samples per iteration over the whole grid
  int64_t steps = 4;          // iterations measured, after one more that warms up
  int64_t microbatches = 4;   // a pipeline's (at most its replica's batch)
  std::string json_out;
  std::FILE* out = nullptr;   // nullptr: stdout
};

struct LayoutResult {
  int dp = 1, pp = 1, tp = 1;
  RunConfig cfg;              // the run it is
  std::string refused;        // why the lab refused it (empty: it ran)
  double ms_per_iteration = 0;
  std::map<std::string, double> bytes_by_group;  // "dp", "pp", "tp": per iteration, over every rank
  int busiest_rank = -1;
  double busiest_rank_bytes = 0;  // per iteration
  double wire_ms = 0;             // busiest_rank_bytes through one link (0 without --link-gbps)
};

// Every factorization dp x pp x tp = world_size (dp largest first), each as the run it would be,
// validated (refused ones carry the reason).
std::vector<LayoutResult> plan_layouts(const BenchLayoutsOptions& opt);
// Runs one planned layout and fills in its figures from its trace.
void measure_layout(LayoutResult& l, const WorldFactory& make_world);
// Plans, runs and prints every layout; returns an exit code (ConfigError for bad options).
int bench_layouts(const BenchLayoutsOptions& opt, const WorldFactory& make_world);

}  // namespace lab
