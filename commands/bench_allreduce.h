// dtlab bench allreduce: allreduce (float32 sum, in place) time, algbw, busbw and #wrong per
// message size, nccl-tests style, for several world sizes and algorithms, next to a copy floor.
// Timing follows tools/peers/mpi_allreduce_bench.c (the Open MPI peer) so that the two can be
// compared line by line (tools/bench_allreduce_vs_mpi.sh): per size, warm-up calls, then batches
// of m back-to-back calls bracketed by barriers, m calibrated to about batch_seconds per batch;
// time = median over batches of batch time / m, measured on rank 0 after the closing barrier.
// algbw = S / t; busbw = algbw x 2(N-1)/N (nccl-tests doc/PERFORMANCE.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "communicator.h"
#include "transport.h"

namespace lab {

// What bench allreduce times (nccl-tests' all_reduce_perf, reduce_scatter_perf, all_gather_perf):
// S bytes per rank in place, N blocks of S/(4N) floats for the last two (S rounded down to N
// whole floats per block, as nccl-tests rounds its count). busbw = algbw x 2(N-1)/N for the
// allreduce, x (N-1)/N for the others.
enum class BenchCollective { Allreduce, ReduceScatter, Allgather };
const char* bench_collective_name(BenchCollective c);  // "allreduce", "reduce_scatter", "allgather"
BenchCollective parse_bench_collective(const std::string& name);  // throws ConfigError naming --collective

struct BenchAllreduceOptions {
  std::string collective = "allreduce";  // allreduce, reduce_scatter or allgather
  std::vector<int> world_sizes = {2, 4, 8};
  std::vector<std::string> algorithms = {"ring", "naive", "tree"};
  std::string comm = "threads";       // the transport; threads: N emulated ranks, one thread each
  // where the buffers live: cpu (host memory), sim or cuda[:N] (every rank's buffer on that
  // device, the ring's copies device-to-device and its adds the device's, the copy floor a
  // device-to-device copy; naive and tree are staged through the host, as in a run)
  std::string device = "cpu";
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = uint64_t{64} << 20;
  uint64_t step_factor = 4;
  int warmup = 3;                     // calls before timing, per size and algorithm
  int batches = 15;                   // timed batches; the median is reported
  double batch_seconds = 0.01;        // target length of one batch
  int max_calls = 2000;               // calls per batch at most (as the MPI peer)
  double timeout_s = 120.0;           // Transport timeout: a stuck rank fails the benchmark
  std::string json_out;               // also write every figure here as JSON (lessons read it)
  std::FILE* out = nullptr;           // where the tables go (nullptr: stdout)
};

// What every rank runs, over any transport (one thread per rank for threads; one process per
// rank under mpirun). All ranks must pass the same plan.
struct AllreduceBenchPlan {
  BenchCollective collective = BenchCollective::Allreduce;
  std::vector<uint64_t> sizes;  // bytes, multiples of 4 (of 4N for reduce_scatter and allgather)
  std::vector<AllreduceAlgorithm> algorithms;
  int warmup = 3;
  int batches = 15;
  double batch_seconds = 0.01;
  int max_calls = 2000;
};

// One message size: seconds per call of each algorithm (plan order) and of the copy floor, and
// the wrong elements summed over ranks and both checks. Filled on rank 0 only.
struct AllreduceBenchRow {
  uint64_t bytes = 0;
  std::vector<double> seconds;  // per algorithm
  std::vector<uint64_t> wrong;  // per algorithm
  double floor_seconds = 0;     // every rank memcpy's its buffer once
};

// The per-rank body: times every size and algorithm on this rank's transport; rank 0 calls
// on_row (if set) as each size is done and returns every row. Throws what the collectives throw.
// world_size is t.world_size(), passed for clarity at the call site.
// mem: the rank's device (its buffers there, DeviceMemory's copies and adds); nullptr: host memory.
std::vector<AllreduceBenchRow> bench_allreduce_rank(Transport& t, int world_size, const AllreduceBenchPlan& plan,
                                                    const std::function<void(const AllreduceBenchRow&)>& on_row = {},
                                                    DeviceMemory* mem = nullptr);

// The command: runs the plan for every world size and prints the tables. Returns an exit code.
int bench_allreduce(const BenchAllreduceOptions& opt);

}  // namespace lab
