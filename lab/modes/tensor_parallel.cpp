#include "tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "batchnorm.h"
#include "config.h"
#include "conv2d.h"
#include "errors.h"
#include "flatten.h"
#include "linear.h"
#include "maxpool2d.h"
#include "model.h"
#include "relu.h"

namespace lab {

const char* tp_role_name(TpRole role) {
  switch (role) {
    case TpRole::Replicated: return "replicated";
    case TpRole::Column: return "column";
    case TpRole::Row: return "row";
    case TpRole::Local: return "local";
  }
  return "?";
}

int TpPlan::backward_allreduces() const {
  int n = 0;
  for (const auto& [column, row] : pairs) n += column > first_with_params;
  return n;
}

namespace {

bool is_layer(Module& m) { return dynamic_cast<Linear*>(&m) || dynamic_cast<Conv2d*>(&m); }
// Modules that work feature by feature (channel by channel): they run on a rank's slice exactly.
bool per_feature(Module& m) {
  return dynamic_cast<BatchNorm*>(&m) || dynamic_cast<ReLU*>(&m) || dynamic_cast<MaxPool2d*>(&m);
}
int64_t outputs_of(Module& m) {
  if (auto* l = dynamic_cast<Linear*>(&m)) return l->out_features();
  return static_cast<Conv2d&>(m).out_channels();
}
int64_t inputs_of(Module& m) {
  if (auto* l = dynamic_cast<Linear*>(&m)) return l->in_features();
  return static_cast<Conv2d&>(m).in_channels();
}
const char* unit_of(Module& m) { return dynamic_cast<Linear*>(&m) ? "features" : "channels"; }

// A module's state in state_dict order: params() then buffers().
struct Entry {
  std::string name;
  Tensor* value = nullptr;   // float
  int64_t* i64 = nullptr;    // num_batches_tracked
};
std::vector<Entry> entries(Module& m) {
  std::vector<Entry> out;
  for (Param* p : m.params()) out.push_back({p->name, &p->value, nullptr});
  for (Buffer* b : m.buffers()) {
    if (b->is_int64) out.push_back({b->name, nullptr, &b->i64});
    else out.push_back({b->name, &b->value, nullptr});
  }
  return out;
}

// The dimension each of the module's state entries is cut along under `role` (-1: held whole).
int cut_dim(const Entry& e, TpRole role) {
  if (e.i64) return -1;
  switch (role) {
    case TpRole::Column: return 0;                        // weight rows (output features/channels), bias
    case TpRole::Row: return e.name == "weight" ? 1 : -1;  // weight columns (input ...); the bias whole
    case TpRole::Local: return 0;                         // BatchNorm's weight, bias, running statistics
    case TpRole::Replicated: return -1;
  }
  return -1;
}

std::string divisors_text(const std::vector<int64_t>& sizes) {
  int64_t g = 0;
  for (int64_t s : sizes) g = std::gcd(g, s);
  std::string out;
  std::vector<int64_t> ok;
  for (int64_t d = 1; d <= std::min<int64_t>(g, kMaxWorldSize); ++d)
    if (g % d == 0) ok.push_back(d);
  for (size_t i = 0; i < ok.size(); ++i)
    out += (i == 0 ? "" : i + 1 == ok.size() ? " or " : ", ") + std::to_string(ok[i]);
  return out;
}

std::string sizes_text(const std::vector<int64_t>& sizes) {
  std::string out;
  for (size_t i = 0; i < sizes.size(); ++i)
    out += (i == 0 ? "" : i + 1 == sizes.size() ? " and " : ", ") + std::to_string(sizes[i]);
  return out;
}

// Copies the slice (rank of tp along dim) between a whole tensor of shape `shape` and its shard:
// to_shard true copies whole -> shard.
void slice_copy(const std::vector<int64_t>& shape, int dim, int rank, int tp, const float* whole_in, float* whole_out,
                const float* shard_in, float* shard_out, bool to_shard) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t len = shape[static_cast<size_t>(dim)], part = len / tp;
  const size_t block = static_cast<size_t>(part * inner) * sizeof(float);
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t w = (o * len + rank * part) * inner, s = o * part * inner;
    if (to_shard) std::memcpy(shard_out + s, whole_in + w, block);
    else std::memcpy(whole_out + w, shard_in + s, block);
  }
}

std::vector<int64_t> shard_shape(std::vector<int64_t> shape, int dim, int tp) {
  if (dim >= 0) shape[static_cast<size_t>(dim)] /= tp;
  return shape;
}

// Copies whole's state into the shard (same module kind, the shard's shapes) under role.
void load_state(Module& whole, Module& shard, TpRole role, int rank, int tp) {
  const std::vector<Entry> w = entries(whole), s = entries(shard);
  for (size_t i = 0; i < w.size() && i < s.size(); ++i) {
    if (w[i].i64) {
      *s[i].i64 = *w[i].i64;
      continue;
    }
    const int dim = cut_dim(w[i], role);
    if (dim < 0) s[i].value->data = w[i].value->data;
    else copy_slice(*w[i].value, dim, rank, tp, *s[i].value);
  }
}

}  // namespace

// ---- the plan ----

TpPlan tensor_parallel_plan(Model& model, int tp, const std::string& model_name) {
  if (tp < 1) throw ConfigError("--tp must be at least 1, got " + std::to_string(tp));
  TpPlan plan;
  plan.tp = tp;
  plan.first_with_params = model.param_layout().first_with_params;
  const size_t n = model.size();
  std::vector<size_t> layers;
  for (size_t i = 0; i < n; ++i)
    if (is_layer(model.module(i))) layers.push_back(i);
  std::vector<TpRole> roles(n, TpRole::Replicated);
  for (size_t k = 0; k + 1 < layers.size(); k += 2) {
    const size_t col = layers[k], row = layers[k + 1];
    Module &c = model.module(col), &r = model.module(row);
    for (size_t j = col + 1; j < row; ++j)
      if (!per_feature(model.module(j)))
        throw ConfigError("--mode tensor: the " + model_name + "'s " + model.module(j).describe() + " (module " +
                              std::to_string(j) + ") lies between the column-parallel " + c.describe() +
                              " and the row-parallel " + r.describe() + ", and does not work feature by feature",
                          "only BatchNorm, ReLU and MaxPool2d run on a rank's slice of the features");
    if (outputs_of(c) != inputs_of(r))
      throw ConfigError("--mode tensor: the " + model_name + "'s " + c.describe() + " (module " + std::to_string(col) +
                        ") does not feed " + r.describe() + " (module " + std::to_string(row) + ") feature by feature");
    roles[col] = TpRole::Column;
    roles[row] = TpRole::Row;
    for (size_t j = col + 1; j < row; ++j) roles[j] = TpRole::Local;
    plan.pairs.emplace_back(col, row);
  }
  for (size_t i = 0; i < n; ++i) {
    Module& m = model.module(i);
    TpModulePlan mp;
    mp.index = i;
    mp.describe = m.describe();
    mp.role = roles[i];
    if (mp.role == TpRole::Column) mp.split = outputs_of(m);
    if (mp.role == TpRole::Row) mp.split = inputs_of(m);
    for (const Entry& e : entries(m)) {
      TpTensorPlan t;
      t.name = e.name;
      t.is_int64 = e.i64 != nullptr;
      t.dim = cut_dim(e, mp.role);
      if (e.value) t.whole = e.value->shape;
      t.shard = shard_shape(t.whole, t.dim, 1);
      if (mp.role == TpRole::Local && t.dim == 0) mp.split = t.whole[0];
      mp.tensors.push_back(t);
    }
    plan.modules.push_back(mp);
  }
  // Every cut size must split evenly (Megatron's divide(): "{} is not divisible by {}")
  const std::vector<int64_t> sizes = tp_split_sizes(plan);
  for (const auto& [col, row] : plan.pairs) {
    Module& c = model.module(col);
    const int64_t split = outputs_of(c);
    if (split % tp == 0) continue;
    throw ConfigError("--tp " + std::to_string(tp) + ": the " + model_name + "'s " + c.describe() + " (module " +
                          std::to_string(col) + ") is column-parallel, its " + std::to_string(split) + " output " +
                          unit_of(c) + " cut into " + std::to_string(tp) + " equal slices (and " +
                          model.module(row).describe() + "'s input " + unit_of(model.module(row)) + " with them), and " +
                          std::to_string(tp) + " does not divide " + std::to_string(split),
                      "--tp must divide " + sizes_text(sizes) + " (the " + model_name + "'s cut sizes): " +
                          divisors_text(sizes));
  }
  for (TpModulePlan& mp : plan.modules)
    for (TpTensorPlan& t : mp.tensors) t.shard = shard_shape(t.whole, t.dim, tp);
  return plan;
}

std::vector<int64_t> tp_split_sizes(const TpPlan& plan) {
  std::vector<int64_t> out;
  for (const TpModulePlan& m : plan.modules)
    if (m.role == TpRole::Column && std::find(out.begin(), out.end(), m.split) == out.end()) out.push_back(m.split);
  return out;
}

std::string tp_plan_text(const TpPlan& plan) {
  std::string s;
  for (const TpModulePlan& m : plan.modules) {
    s += (s.empty() ? "" : " | ") + std::to_string(m.index) + ": " + m.describe + " " + tp_role_name(m.role);
    if (m.split > 0) s += " (" + std::to_string(m.split / plan.tp) + " of " + std::to_string(m.split) + ")";
  }
  return s;
}

// ---- slices ----

void copy_slice(const Tensor& whole, int dim, int rank, int tp, Tensor& shard) {
  shard.resize(shard_shape(whole.shape, dim, tp));
  slice_copy(whole.shape, dim, rank, tp, whole.ptr(), nullptr, nullptr, shard.ptr(), true);
}

void put_slice(const Tensor& shard, int dim, int rank, int tp, Tensor& whole) {
  slice_copy(whole.shape, dim, rank, tp, nullptr, whole.ptr(), shard.ptr(), nullptr, false);
}

// ---- f and g ----

ColumnParallel::ColumnParallel(std::unique_ptr<Module> shard, int64_t whole_out, int rank, int tp, TpCollectives& comm,
                               int tag)
    : m_shard(std::move(shard)), m_whole_out(whole_out), m_rank(rank), m_tp(tp), m_comm(comm), m_tag(tag) {}

std::string ColumnParallel::describe() const {
  const int64_t part = m_whole_out / m_tp;
  return "ColumnParallel" + m_shard->describe() + " [outputs " + std::to_string(m_rank * part) + ".." +
         std::to_string((m_rank + 1) * part - 1) + " of " + std::to_string(m_whole_out) + "]";
}

void ColumnParallel::backward(const Tensor& dy, Tensor* dx) {
  m_shard->backward(dy, dx);
  // f's backward: the input gradient is the sum over every output feature; this rank's holds its own
  if (dx) m_comm.allreduce_sum(dx->ptr(), static_cast<size_t>(dx->numel()), kTpInputGrads, m_tag);
}

RowParallel::RowParallel(std::unique_ptr<Module> shard, const Tensor& bias, int64_t whole_in, int rank, int tp,
                         TpCollectives& comm, int tag)
    : m_shard(std::move(shard)), m_has_bias(bias.numel() > 0), m_whole_in(whole_in), m_rank(rank), m_tp(tp),
      m_comm(comm), m_tag(tag) {
  if (m_has_bias) m_bias = {"bias", bias, Tensor(bias.shape)};
}

std::string RowParallel::describe() const {
  const int64_t part = m_whole_in / m_tp;
  return "RowParallel" + m_shard->describe() + " [inputs " + std::to_string(m_rank * part) + ".." +
         std::to_string((m_rank + 1) * part - 1) + " of " + std::to_string(m_whole_in) + "]" +
         (m_has_bias ? " + bias after the allreduce" : "");
}

std::vector<Param*> RowParallel::params() {
  std::vector<Param*> out = m_shard->params();
  if (m_has_bias) out.push_back(&m_bias);
  return out;
}

void RowParallel::forward(const Tensor& x, Tensor& y, Mode mode) {
  m_shard->forward(x, y, mode);
  // g: the partial outputs summed over the ranks, then the bias once (Megatron: output_ + bias)
  m_comm.allreduce_sum(y.ptr(), static_cast<size_t>(y.numel()), kTpActivations, m_tag);
  if (!m_has_bias) return;
  const int64_t n = y.dim(0), c = y.dim(1), inner = y.numel() / std::max<int64_t>(1, n * c);
  const float* b = m_bias.value.ptr();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      float* p = y.ptr() + (i * c + ch) * inner;
      for (int64_t k = 0; k < inner; ++k) p[k] += b[ch];
    }
}

void RowParallel::backward(const Tensor& dy, Tensor* dx) {
  if (m_has_bias) {
    // dy's sum per output feature (channel) over the batch (and positions) in double, sample by
    // sample, rounded once: Linear's and Conv2d's order, so the same bits as the whole layer's
    const int64_t n = dy.dim(0), c = dy.dim(1), inner = dy.numel() / std::max<int64_t>(1, n * c);
    float* db = m_bias.grad.ptr();
    for (int64_t ch = 0; ch < c; ++ch) {
      double s = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const float* p = dy.ptr() + (i * c + ch) * inner;
        for (int64_t k = 0; k < inner; ++k) s += p[k];
      }
      db[ch] += static_cast<float>(s);
    }
  }
  m_shard->backward(dy, dx);  // g's backward: dy unchanged
}

// ---- shards ----

std::unique_ptr<Module> shard_module(Module& whole, TpRole role, int rank, int tp) {
  std::unique_ptr<Module> out;
  if (auto* l = dynamic_cast<Linear*>(&whole)) {
    if (role == TpRole::Column) out = std::make_unique<Linear>(l->in_features(), l->out_features() / tp, l->has_bias());
    else if (role == TpRole::Row) out = std::make_unique<Linear>(l->in_features() / tp, l->out_features(), false);
    else out = std::make_unique<Linear>(l->in_features(), l->out_features(), l->has_bias());
  } else if (auto* c = dynamic_cast<Conv2d*>(&whole)) {
    const int k = c->kernel_size(), pad = c->padding();
    if (role == TpRole::Column)
      out = std::make_unique<Conv2d>(c->in_channels(), c->out_channels() / tp, k, pad, c->has_bias());
    else if (role == TpRole::Row) out = std::make_unique<Conv2d>(c->in_channels() / tp, c->out_channels(), k, pad, false);
    else out = std::make_unique<Conv2d>(c->in_channels(), c->out_channels(), k, pad, c->has_bias());
  } else if (auto* b = dynamic_cast<BatchNorm*>(&whole)) {
    BatchNormOptions o = b->options();
    if (role == TpRole::Local) o.num_features /= tp;
    out = std::make_unique<BatchNorm>(o);
  } else if (auto* p = dynamic_cast<MaxPool2d*>(&whole)) {
    out = std::make_unique<MaxPool2d>(p->kernel_size());
  } else if (dynamic_cast<ReLU*>(&whole)) {
    out = std::make_unique<ReLU>();
  } else if (dynamic_cast<Flatten*>(&whole)) {
    out = std::make_unique<Flatten>();
  } else {
    throw Error("--mode tensor: no rule to split or copy " + whole.describe());
  }
  load_state(whole, *out, role, rank, tp);
  return out;
}

// ---- one rank's model ----

TensorParallelModel::TensorParallelModel(Model& whole, const TpPlan& plan, int rank, TpCollectives& comm)
    : m_plan(plan), m_rank(rank), m_model(std::make_unique<Model>()) {
  const int tp = plan.tp;
  for (const TpModulePlan& mp : plan.modules) {
    Module& w = whole.module(mp.index);
    const int tag = static_cast<int>(mp.index);
    if (mp.role == TpRole::Column) {
      m_model->add(std::make_unique<ColumnParallel>(shard_module(w, mp.role, rank, tp), mp.split, rank, tp, comm, tag));
    } else if (mp.role == TpRole::Row) {
      Tensor bias;
      for (const Entry& e : entries(w))
        if (e.name == "bias") bias = *e.value;
      m_model->add(std::make_unique<RowParallel>(shard_module(w, mp.role, rank, tp), bias, mp.split, rank, tp, comm, tag));
    } else {
      m_model->add(shard_module(w, mp.role, rank, tp));
    }
    for (const TpTensorPlan& t : mp.tensors)
      if (t.dim >= 0) m_packed += static_cast<size_t>(Tensor::numel_of(t.shard));
  }
}

TensorParallelModel::~TensorParallelModel() = default;

void TensorParallelModel::load(Model& whole) {
  for (const TpModulePlan& mp : m_plan.modules) {
    const std::vector<Entry> w = entries(whole.module(mp.index)), s = entries(m_model->module(mp.index));
    for (size_t i = 0; i < w.size(); ++i) {
      const TpTensorPlan& t = mp.tensors[i];
      if (t.is_int64) *s[i].i64 = *w[i].i64;
      else if (t.dim < 0) s[i].value->data = w[i].value->data;
      else copy_slice(*w[i].value, t.dim, m_rank, m_plan.tp, *s[i].value);
    }
  }
}

void TensorParallelModel::pack(float* out) {
  size_t off = 0;
  for (const TpModulePlan& mp : m_plan.modules) {
    const std::vector<Entry> s = entries(m_model->module(mp.index));
    for (size_t i = 0; i < s.size(); ++i) {
      if (mp.tensors[i].dim < 0) continue;
      std::memcpy(out + off, s[i].value->ptr(), s[i].value->data.size() * sizeof(float));
      off += s[i].value->data.size();
    }
  }
}

void TensorParallelModel::unpack(const float* packed, int from, Model& whole) const {
  size_t off = 0;
  for (const TpModulePlan& mp : m_plan.modules) {
    const std::vector<Entry> w = entries(whole.module(mp.index));
    for (size_t i = 0; i < w.size(); ++i) {
      const TpTensorPlan& t = mp.tensors[i];
      if (t.dim < 0) continue;
      slice_copy(t.whole, t.dim, from, m_plan.tp, nullptr, w[i].value->ptr(), packed + off, nullptr, false);
      off += static_cast<size_t>(Tensor::numel_of(t.shard));
    }
  }
}

void TensorParallelModel::store_whole(Model& whole) {
  for (const TpModulePlan& mp : m_plan.modules) {
    const std::vector<Entry> w = entries(whole.module(mp.index)), s = entries(m_model->module(mp.index));
    for (size_t i = 0; i < w.size(); ++i) {
      const TpTensorPlan& t = mp.tensors[i];
      if (t.is_int64) *w[i].i64 = *s[i].i64;
      else if (t.dim < 0) w[i].value->data = s[i].value->data;
    }
  }
}

}  // namespace lab
