// Where a run computes (--device) and the numerics switches that go with it, with PyTorch's names.
// The executor that computes on a device is lab/nn/executor.h's; this header is what the
// configuration needs to know.
#pragma once

#include <string>
#include <vector>

namespace lab {

struct ComputeOptions {
  std::string device = "cpu";        // "cpu" | "cuda" | "cuda:N" | "sim"
  bool allow_tf32 = false;           // torch.backends.cuda.matmul.allow_tf32 and cudnn.allow_tf32
  bool cudnn_benchmark = false;      // torch.backends.cudnn.benchmark
  bool cudnn_deterministic = false;  // torch.backends.cudnn.deterministic
  // --cuda-graphs: DDP's training step of one rank captured once as a CUDA Graph and replayed
  // (torch.cuda.graphs' whole-step capture); lab/nn/executor.h: graph_step
  bool cuda_graphs = false;
  // --rank-devices: the GPU index of each rank (empty: the default of rank_device_map)
  std::vector<int> rank_devices;
  // Not a setting: the machine each rank runs on (the lowest rank on the same machine), filled by
  // the runtime of ranks launched as processes (mpirun). Empty: every rank on this machine.
  std::vector<int> rank_nodes;
};

// sim: a simulated GPU (backends/sim): the GPU executor's protocol with the CPU's ops, one device
// that every rank of the run shares.
struct DeviceSpec {
  std::string kind = "cpu";  // "cpu" | "cuda" | "sim"
  int index = 0;             // cuda:N
  bool is_cpu() const { return kind == "cpu"; }
  bool is_cuda() const { return kind == "cuda"; }
  std::string str() const { return is_cpu() || kind == "sim" ? kind : kind + ":" + std::to_string(index); }
};

// "cpu", "cuda" (= cuda:0), "cuda:N" or "sim". Throws ConfigError naming `flag` and the value
// otherwise.
DeviceSpec parse_device(const std::string& text, const std::string& flag = "--device");

// The GPU index of each of world_size ranks: --rank-devices when given (one per rank, else a
// ConfigError); otherwise, with --comm nccl, the k-th rank of a machine on GPU device + k (NCCL
// wants a GPU per rank; machines from opt.rank_nodes, all ranks on one without it: rank r on GPU
// r); otherwise every rank on --device's GPU (emulated ranks, or MPI processes, sharing it). Empty
// on the CPU.
std::vector<int> rank_device_map(const ComputeOptions& opt, int world_size, const std::string& comm);

// NCCL refuses two ranks on one GPU: throws ConfigError naming the two ranks and the GPU when the
// map puts two ranks of one machine on one GPU, before NCCL is called. map: rank_device_map's;
// nodes: ComputeOptions::rank_nodes (empty: all ranks on one machine).
void check_one_rank_per_gpu(const std::vector<int>& map, const std::vector<int>& nodes = {});

// Checks the switches against the device: the cuDNN and TF32 switches mean nothing on the CPU or
// the simulated GPU, so asking for them there is refused (ConfigError naming the flag), as is a
// malformed device. --cuda-graphs needs a device (cuda, or sim, which runs the graphed step's
// calls one by one).
void validate_compute_options(const ComputeOptions& opt);

}  // namespace lab
