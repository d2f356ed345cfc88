// Tensor parallelism's mechanisms (--mode tensor, mode_tensor.cpp), each testable alone: Megatron-LM's
// split of a layer pair (Shoeybi et al., 2019) over T ranks, every rank computing on the same batch.
//   plan      which module is column-parallel (its output features or channels cut into T slices,
//             rank r holding slice r of the weight's rows and of the bias), row-parallel (its input
//             features or channels cut the same way: rank r holds the weight's columns for the slice
//             the column layer before it produced, and computes a partial sum of the whole output),
//             local (between the two: BatchNorm, ReLU and MaxPool2d work per feature or channel, so
//             each rank runs them on its own slice, exactly) or replicated (every rank runs the
//             whole module on the same input: identical values and gradients, nothing to send).
//             Weight layers pair up in order (first column, second row, third column, ...); an odd
//             last one stays replicated. dtlab's mlp: fc1 column, BatchNorm1d(256) and ReLU local,
//             fc2 row, the rest replicated; the cnn: conv1 column (by output channels), BatchNorm2d(32),
//             ReLU and MaxPool2d local, conv2 row (by input channels), BatchNorm2d(64) ... Flatten
//             replicated, fc1 column, ReLU local, fc2 row.
//   f and g   Megatron's copy_to_tensor_model_parallel_region (f: identity forward, allreduce of
//             the input gradient backward: before a column-parallel layer) and
//             reduce_from_tensor_model_parallel_region (g: allreduce of the partial outputs forward,
//             identity backward: after a row-parallel layer). As in Megatron's ColumnParallelLinear
//             and RowParallelLinear they live inside the layers (ColumnParallel, RowParallel below),
//             and the row layer's bias is added once, after g. A column layer whose input is data
//             (the model's first layer with parameters) computes no input gradient, so its f has
//             nothing to allreduce: autograd runs no backward there. Per pair: one allreduce in
//             forward, one in backward (none for the first layer's f).
//   exactness the column layer's outputs and gradients, and the local BatchNorm's, are the same sums
//             as the whole layer's (every output feature is computed whole, from the whole input, by
//             the same kernel; BatchNorm's statistics are per feature over the batch); the row
//             layer's output is T partial sums added by the allreduce, equal to the whole layer's
//             to rounding (tests/test_tensor_parallel.cpp measures both, bits and bound).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "module.h"

namespace lab {

class Model;

// ---- the plan ----
enum class TpRole : uint8_t { Replicated, Column, Row, Local };
const char* tp_role_name(TpRole role);  // "replicated", "column", "row", "local"

// One parameter or buffer of a module: its whole shape, and the dimension cut into T slices (-1:
// every rank holds it whole: a replicated module's state, a row layer's bias, num_batches_tracked).
struct TpTensorPlan {
  std::string name;                 // "weight", "running_mean", ...
  std::vector<int64_t> whole, shard;
  int dim = -1;
  bool is_int64 = false;            // num_batches_tracked
};

struct TpModulePlan {
  size_t index = 0;                 // the module's index in the model (state_dict's "1" of "1.weight")
  std::string describe;             // the whole module: "Linear(784, 256)"
  TpRole role = TpRole::Replicated;
  int64_t split = 0;                // the size of the cut dimension: a column layer's output features or
                                    // channels, a row layer's input ones, a local module's; 0: replicated
  std::vector<TpTensorPlan> tensors;  // params() then buffers(), in the module's order
};

struct TpPlan {
  int tp = 1;
  std::vector<TpModulePlan> modules;            // every module of the model, in order
  std::vector<std::pair<size_t, size_t>> pairs; // (column layer, row layer) module indices
  size_t first_with_params = 0;                 // the model's first module with parameters (its f is elided)
  // What the plan predicts per iteration (the run counts what ran: mode_tensor.cpp's summary):
  // g after every row layer; f before every column layer but the first layer with parameters.
  int forward_allreduces() const { return static_cast<int>(pairs.size()); }
  int backward_allreduces() const;
};

// The split of `model` (model_name: "mlp" or "cnn", for messages) over tp ranks. Throws ConfigError
// naming --tp and the layer when tp does not divide a cut dimension, or when a module between a
// column and a row layer does not work per feature (only BatchNorm, ReLU and MaxPool2d do).
TpPlan tensor_parallel_plan(Model& model, int tp, const std::string& model_name);
// The sizes every --tp must divide (256 for the mlp; 32 and 128 for the cnn).
std::vector<int64_t> tp_split_sizes(const TpPlan& plan);
// "Linear(784, 256): column [128 of 256 features] | ...": the plan, for the header.
std::string tp_plan_text(const TpPlan& plan);

// ---- slices ----
// Rank r's slice (of tp equal slices along dimension dim) of `whole` into `shard` (resized), and back.
void copy_slice(const Tensor& whole, int dim, int rank, int tp, Tensor& shard);
void put_slice(const Tensor& shard, int dim, int rank, int tp, Tensor& whole);

// ---- f and g: the allreduces ----
// What the layers call for f's backward and g's forward: an allreduce (sum) over the
// tensor-parallel ranks, every rank ending with the same bits. The mode's goes through the rank's
// Communicator (events, bytes, its compute timeline cut around it); a test's may sum by hand.
class TpCollectives {
 public:
  virtual ~TpCollectives() = default;
  // what: kTpActivations (g, forward) or kTpInputGrads (f, backward); tag: the layer's module index.
  virtual void allreduce_sum(float* data, size_t count, const char* what, int tag) = 0;
};
constexpr const char* kTpActivations = "tp activations";  // g: a row layer's partial outputs
constexpr const char* kTpInputGrads = "tp input grads";   // f: a column layer's partial input gradients

// Megatron-LM's ColumnParallelLinear (gather_output=False), and a Conv2d cut the same way by output
// channels: the rank's slice of the layer (a Linear or Conv2d of the slice's shape) on the whole
// input. backward: the slice's parameter gradients, and when an input gradient is asked for, the
// rank's part of it (the sum over its output features) allreduced: f's backward.
class ColumnParallel : public Module {
 public:
  ColumnParallel(std::unique_ptr<Module> shard, int64_t whole_out, int rank, int tp, TpCollectives& comm, int tag);
  std::string kind() const override { return "ColumnParallel" + m_shard->kind(); }
  std::string describe() const override;
  void forward(const Tensor& x, Tensor& y, Mode mode) override { m_shard->forward(x, y, mode); }
  void backward(const Tensor& dy, Tensor* dx) override;
  std::vector<Param*> params() override { return m_shard->params(); }
  int64_t forward_macs(const std::vector<int64_t>& in_shape) const override { return m_shard->forward_macs(in_shape); }
  int64_t saved_bytes() const override { return m_shard->saved_bytes(); }
  Module& shard() { return *m_shard; }

 private:
  std::unique_ptr<Module> m_shard;
  int64_t m_whole_out;
  int m_rank, m_tp;
  TpCollectives& m_comm;
  int m_tag;
};

// Megatron-LM's RowParallelLinear (input_is_parallel=True), and a Conv2d cut by input channels: the
// rank's slice (a Linear or Conv2d without bias, of the slice's shape) computes a partial output
// from the rank's slice of the input; g allreduces the partial outputs; the bias (every rank holds
// it whole) is added once, after the sum. backward: dy reaches the slice unchanged (g's backward is
// the identity); the bias gradient is dy's sum over the batch (and positions), in double, as
// Linear and Conv2d sum theirs.
class RowParallel : public Module {
 public:
  // bias: the whole layer's bias (empty tensor: none)
  RowParallel(std::unique_ptr<Module> shard, const Tensor& bias, int64_t whole_in, int rank, int tp,
              TpCollectives& comm, int tag);
  std::string kind() const override { return "RowParallel" + m_shard->kind(); }
  std::string describe() const override;
  void forward(const Tensor& x, Tensor& y, Mode mode) override;
  void backward(const Tensor& dy, Tensor* dx) override;
  std::vector<Param*> params() override;
  int64_t forward_macs(const std::vector<int64_t>& in_shape) const override { return m_shard->forward_macs(in_shape); }
  int64_t saved_bytes() const override { return m_shard->saved_bytes(); }
  Module& shard() { return *m_shard; }
  Param& bias() { return m_bias; }

 private:
  std::unique_ptr<Module> m_shard;
  bool m_has_bias;
  Param m_bias;
  int64_t m_whole_in;
  int m_rank, m_tp;
  TpCollectives& m_comm;
  int m_tag;
};

// The module rank r holds of `whole` under `role`, its state copied from whole's: a Linear, Conv2d
// or BatchNorm of the slice's shape (Column, Row: without the bias, which RowParallel holds; Local),
// or a copy of the module (Replicated, and the modules without parameters). Not wrapped in
// ColumnParallel or RowParallel: the bare slice, what the tests compare with the whole layer.
std::unique_ptr<Module> shard_module(Module& whole, TpRole role, int rank, int tp);

// ---- one rank's model ----
// The model rank r computes with: every module of the whole model at the same index, the column and
// row layers as ColumnParallel and RowParallel over their slices, the local ones as slices, the
// replicated ones as copies (their parameters are stepped by every rank alike). Its params() are
// what the rank's optimizer steps. The whole model stays the run's (evaluation, saving): gather()
// below writes every rank's slices into it.
class TensorParallelModel {
 public:
  TensorParallelModel(Model& whole, const TpPlan& plan, int rank, TpCollectives& comm);
  ~TensorParallelModel();
  Model& model() const { return *m_model; }
  const TpPlan& plan() const { return m_plan; }
  // The rank's slices and copies of whole's parameters and buffers (whole: the same model).
  void load(Model& whole);
  // The rank's slices (column, row and local modules' parameters and float buffers, in plan order)
  // as one flat buffer: the same length on every rank, for an allgather.
  size_t packed_floats() const { return m_packed; }
  void pack(float* out);
  // Rank `from`'s packed slices (its pack()) into whole's slices.
  void unpack(const float* packed, int from, Model& whole) const;
  // What every rank holds whole (replicated modules, row layers' biases, num_batches_tracked) into whole.
  void store_whole(Model& whole);

 private:
  TpPlan m_plan;
  int m_rank;
  std::unique_ptr<Model> m_model;
  size_t m_packed = 0;
};

}  // namespace lab
