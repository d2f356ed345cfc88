// Training steps at scale, simulated: a step of a model under data, pipeline and tensor parallelism
// on a Topology (topology.h), its compute from a stated GPU throughput or from a dtlab run's measured
// compute, its communication from the collective simulator (collective_sim.h: the same schedules,
// over the grid's groups, all groups of an axis at once so that they share NICs and uplinks).
// `dtlab simulate --step` prints it (commands/simulate_step.h, docs/simulate.md).
//
// The model. Layers, each with its parameter tensors, forward and backward FLOPs per sample and its
// output bytes per sample:
//   mlp, cnn   dtlab's models, built by build_model: a layer per module; FLOPs from module_macs as
//              Model::train_flops_per_sample counts them (forward 2 x MACs, weight gradients 2 x
//              MACs, input gradients 2 x MACs except for the first layer with parameters), so the
//              layers add up to train_flops_per_sample exactly; BatchNorm's buffers are what DDP
//              broadcasts before every forward; the tensor-parallel split is dtlab's own plan
//              (tensor_parallel.h: which allreduce runs where, on which activations) and the
//              pipeline's stages dtlab's own cut (pipeline.h: pipeline_stages).
//   generic    P parameters, F training FLOPs per sample, L equal layers, A activation bytes per
//              sample at every layer boundary: a transformer as Megatron-LM splits it (every layer
//              four weight tensors of P/4L, split over tp: its parameters and FLOPs / T; two
//              allreduces of A per sample in forward, two in backward per layer); FLOPs one third
//              forward, two thirds backward.
//
// The layout dp x pp x tp of N = dp pp tp ranks, Megatron-LM's placement (GridShape: rank =
// t + T (d + D p)): tensor-parallel groups innermost, inside a node when T fits in one; then the
// data-parallel replicas; then the pipeline's stages.
//
// A step, per rank (every group of an axis runs at once; each rank's stage decides its work):
//   compute    the replica's batch G/D cut into M micro-batches (M = 1 without a pipeline), each
//              stage's layers' FLOPs per sample x the micro-batch / the GPU's throughput, or
//              the run's measured seconds per sample spread over the layers by their FLOPs.
//   tensor     (tp > 1) each split layer's allreduces of activations over the tp group, in forward
//              and backward, inside the compute: not overlapped (Megatron's f and g).
//   pipeline   (pp > 1) the schedule (1F1B or GPipe: pipeline.h's simulate_pipeline) of forward and
//              backward blocks; a block includes its send to the next stage (forward: the
//              activations of the micro-batch; backward: their gradients to the previous stage),
//              sent blocking, as Megatron's p2p; all stage boundaries of all pipelines at once.
//              The bubble is the schedule's idle time: (P-1)/(M+P-1) of the step with equal stages.
//   data       (dp > 1) how the dp axis reduces the rank's gradients (its stage's, its slices'):
//     ddp      PyTorch DDP: buckets of bucket_cap_mb (the first 1 MiB), filled in reverse layer
//              order, each allreduced on a communication stream once its layers' backward is done
//              (during the last micro-batch's backward on that stage), one after the other; what
//              is left when the backward ends is exposed. With BatchNorm buffers (dtlab's models on
//              dp only), the buffers' broadcast before the forward (broadcast_buffers), exposed: a
//              chain through every rank, whose latency grows with N.
//              overlap = false: every bucket after the backward (dtlab's --no-overlap).
//     zero     ZeRO stage 2 as DeepSpeed runs it: the same buckets reduce-scattered during the
//              backward (overlapped as ddp's), the optimizer steps its 1/D shard, then the updated
//              parameters are all-gathered bucket by bucket: exposed. (dtlab's --mode zero is
//              PyTorch's ZeroRedundancyOptimizer, stage 1: DDP's allreduce then one broadcast per
//              rank: the same bytes per rank within (N-1)/N; not modelled message by message.)
//     fsdp     FullyShardedDataParallel, FULL_SHARD (ZeRO-3), one unit per layer with parameters
//              (dtlab's --fsdp-wrap layer): before a unit's forward its parameters are all-gathered,
//              again before its backward, its gradients reduce-scattered after it; the next unit's
//              all-gather is issued when a unit's compute starts (forward_prefetch,
//              BACKWARD_PRE), one communication stream in issue order. Pipeline layouts refuse it.
//   optimizer  from a run: its measured optimizer seconds per step x the share of the parameters
//              the rank updates (its stage's and slices', / D under zero and fsdp); from a
//              throughput: 0 (an optimizer step is memory-bound, not FLOPs).
// step = the last rank's end; exposed communication = step - compute - bubble - optimizer.
//
// Not modelled: activation recomputation, interleaved pipeline stages, Megatron's scatter-gather
// of p2p tensors over tp (every tp rank sends its stage's whole activations here), sequence
// parallelism, compute slowed by communication kernels sharing the GPU, memory limits.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collective_sim.h"
#include "topology.h"

namespace lab {

class Model;

struct StepLayer {
  std::string what;                // "Linear(784, 256)", "layer 3"
  double fwd_flops = 0;            // per sample
  double bwd_flops = 0;            // per sample
  std::vector<int64_t> tensors;    // its parameter tensors' elements, in registration order
  double out_bytes = 0;            // its output per sample (what a pipeline stage ending here sends)
  int64_t params() const {
    int64_t p = 0;
    for (int64_t n : tensors) p += n;
    return p;
  }
};

struct StepModel {
  std::string name;                // "mlp", "cnn", "generic"
  std::string describe;            // one line
  std::vector<StepLayer> layers;
  double grad_bytes = 4;           // bytes per gradient (and parameter) element on the wire: dtlab's float32
  double buffer_bytes = 0;         // DDP's broadcast before every forward (BatchNorm's running statistics)
  double input_bytes = 0;          // one sample (a tp group's first column layer's input)
  // generic: allreduces of A per sample per layer over a tp group, in forward and in backward
  int tp_allreduces_per_layer = 2;
  std::shared_ptr<Model> model;    // dtlab's model (its tensor-parallel plan, its pipeline stages); null: generic
  int64_t parameters() const;
  double flops_per_sample() const;  // training: forward + backward
};

// dtlab's mlp or cnn (build_model with seed 0). Throws ConfigError for another name.
StepModel step_model_dtlab(const std::string& name);
struct GenericModelSpec {
  double parameters = 0;           // P
  double flops_per_sample = 0;     // F: a training step's FLOPs per sample (6 P tokens for a transformer)
  int layers = 1;                  // L
  double activation_bytes = 0;     // A: per sample at every layer boundary (tokens x hidden x bytes)
  double grad_bytes = 4;
};
// Throws ConfigError naming the flag (--params, --flops-per-sample, --layers, --activation-bytes).
StepModel step_model_generic(const GenericModelSpec& g);

// Where compute time comes from: a throughput, or a run's measurement.
struct StepCompute {
  double tflops = 0;               // > 0: achieved dense TFLOP/s per GPU: seconds = FLOPs / (tflops 1e12)
  // else measured, for the whole model on one rank: seconds per sample of forward and of backward,
  // and the optimizer's seconds per step
  double fwd_s_per_sample = 0, bwd_s_per_sample = 0, optimizer_s_per_step = 0;
  std::string source;              // "--gpu-tflops 400", "RUN/summary.json: ..."
  std::string run_model;           // measured: the run's model ("mlp", "cnn")
  std::string run_device;          // measured: summary.json's device.device
  int run_world_size = 0;          // measured: the run's ranks
  int64_t run_batch_per_rank = 0;  // measured: samples per rank per step
};
// A run directory's summary.json: compute.forward_seconds, backward_seconds and optimizer_seconds
// (means over the ranks of each phase's seconds summed over the run's training steps), divided by
// the samples each rank computed (samples / ranks, ranks = compute.per_rank's length) and, for the
// optimizer, by steps. Throws IoError (no file) or ConfigError (a field missing or zero), naming
// the file and the field.
StepCompute step_compute_from_run(const std::string& run_dir);

enum class DpSync { Ddp, Zero, Fsdp };
const char* dp_sync_name(DpSync s);  // "ddp", "zero", "fsdp"
DpSync parse_dp_sync(const std::string& s, const std::string& flag = "--mode");

struct StepConfig {
  int64_t global_batch = 4096;     // samples per step over every replica
  DpSync sync = DpSync::Ddp;
  int microbatches = 0;            // a pipeline's M (0: 4 x pp); at most the replica's batch
  std::string schedule = "1f1b";   // or gpipe
  double bucket_cap_mb = 25;       // DDP's, in MiB as PyTorch counts it (bucket_cap_mb x 1024 x 1024 bytes)
  bool overlap = true;             // ddp, zero: buckets during backward (false: after it)
  bool first_iteration = false;    // ddp: PyTorch's first iteration: one bucket of every gradient
  bool broadcast_buffers = true;   // ddp, zero: the buffers' broadcast before every forward (PyTorch's default)
  SimProtocol protocol = SimProtocol::Simple;
  std::vector<SimAlgorithm> algorithms;  // the fastest of these per collective (empty: ring and dbtree
                                         // under NCCL's protocols, NCCL's two; ring under wire: dtlab's)
  int channels = 0;
  bool exact = false;              // wire: exact schedules (every rank's bytes exact; slower)
  StepCompute compute;
};

struct StepLayout {
  int dp = 1, pp = 1, tp = 1;
  int size() const { return dp * pp * tp; }
};
std::string layout_text(const StepLayout& l);  // "64 x 1 x 8"

// One axis's communication in a step: time, bytes and collectives (point-to-point: sends) on its
// busiest rank (hidden or not).
struct AxisComm {
  double seconds = 0;
  double bytes = 0;
  int collectives = 0;
  std::string algorithms;          // "ring", "dbtree", "ring+dbtree"
};

struct StepResult {
  StepLayout layout;
  int nodes = 0, ranks = 0;
  std::string mode;                // "ddp", "tensor", "pipeline", "pipeline+zero", ...
  std::string refused;             // why this layout cannot run (empty: it ran)
  int64_t batch_per_replica = 0;
  int microbatches = 1;
  double micro_batch = 0;          // samples per micro-batch
  double compute_s = 0;            // the busiest rank's compute (its stage's forward + backward)
  double bubble_s = 0;             // the pipeline's idle time without communication
  double optimizer_s = 0;
  double broadcast_s = 0;          // of dp's time: DDP's broadcast of the buffers before the forward
  double exposed_s = 0;            // step - compute - bubble - optimizer
  double step_s = 0;
  double samples_per_s = 0;
  AxisComm dp, pp, tp;
  std::vector<double> sent_per_rank;  // bytes each rank sends in the step (every axis)
  std::vector<std::string> notes;
  bool comm_exceeds_compute() const { return refused.empty() && exposed_s > compute_s; }
};

// Results of collectives already simulated, for a sweep (keyed by the collective, the axis' groups
// and the bytes); one per topology and configuration.
struct StepCache {
  struct Entry {
    SimResult r;
    SimAlgorithm algo = SimAlgorithm::Ring;
    std::vector<double> sent;      // per rank
  };
  std::map<std::string, Entry> entries;
};

// One step of `m` on `t` (t.nodes x t.gpus_per_node must equal l.size(), else a ConfigError)
// in layout l. A layout the model cannot take (a --tp that does not divide a split layer, more
// stages than layers, a global batch the replicas cannot share) comes back with `refused`.
StepResult simulate_step(const Topology& t, const StepModel& m, const StepConfig& c, const StepLayout& l,
                         StepCache* cache = nullptr);

// Every dp x pp x tp = n (dp largest first, then pp).
std::vector<StepLayout> all_layouts(int n);

// GPipe's and 1F1B's bubble: (p - 1) / (m + p - 1) of the step (pipeline.h's bubble_formula).
double step_bubble_fraction(int stages, int micro);

}  // namespace lab
