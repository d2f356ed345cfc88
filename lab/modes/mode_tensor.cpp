// --mode tensor: tensor parallelism as Megatron-LM splits a layer pair (tensor_parallel.h): T ranks,
// one per slice of the split layers, every rank computing on the same whole batch. PyTorch 1.13 has
// no usable tensor-parallel API (a prototype under torch.distributed._shard; DTensor arrives in
// 2.0): the reference is one-rank training (--mode ddp --world-size 1), which this equals to
// rounding (tests/test_tensor_parallel.cpp).
//
// One rank's iteration:
//   - the batch: a DistributedSampler with num_replicas 1, so every rank draws the same batches;
//   - forward and backward of the rank's model (TensorParallelModel): its slices of the column-
//     parallel, row-parallel and local modules, copies of the replicated ones; g's allreduce in
//     forward after every row layer ("tp activations"), f's in backward before every column layer
//     but the first ("tp input grads"), each a Communicator collective tagged with the layer's
//     module index; the compute events stop where one runs;
//   - the rank's optimizer steps what the rank holds: its slices (each rank's own gradients) and
//     the replicated modules (the same gradients on every rank, from the same inputs: nothing to
//     reduce). Every rank computes the same loss; rank 0 counts it.
// Before an evaluation and at the end, every rank's slices are all-gathered into every rank's whole
// model ("tp shards"), so rank 0's is whole for the test accuracy and final.safetensors; BatchNorm's
// running statistics of a local BatchNorm are per rank (its features) and gathered the same way.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "batchnorm.h"
#include "communicator.h"
#include "compute_segments.h"
#include "dataset.h"
#include "ddp.h"
#include "device.h"
#include "errors.h"
#include "events.h"
#include "grid.h"
#include "group_transport.h"
#include "mode.h"
#include "mode_ddp.h"
#include "model.h"
#include "optim.h"
#include "run.h"
#include "sampler.h"
#include "tensor_parallel.h"

namespace lab {

namespace {

int dp_of(const RunConfig& c) { return std::max(1, c.dp); }
int tp_of(const RunConfig& c) { return c.tp > 0 ? c.tp : c.world_size / dp_of(c); }

// The grid of --dp replicas of the tensor-parallel ranks (group_transport.h's placement: world
// rank = t + T d, the slices of a replica on neighbouring ranks).
GridShape grid_of(const RunConfig& c) {
  GridShape g;
  g.dp = dp_of(c);
  g.tp = tp_of(c);
  return g;
}

TpPlan plan_for(const RunConfig& c, Model& model) { return tensor_parallel_plan(model, tp_of(c), c.model); }

class TensorRank : public RankMode, private TpCollectives {
 public:
  explicit TensorRank(RankEnv& env)
      : m_env(env),
        m_grid(grid_of(env.cfg)),
        m_at(m_grid.coords(env.rank)),
        m_sampler({env.train.size, m_grid.dp, m_at.d, env.cfg.shuffle, env.cfg.seed, env.cfg.sampler_drop_last}),
        m_tp(env.model, plan_for(env.cfg, env.model), m_at.t, *this),
        m_params(m_tp.model().params()),
        m_names(param_names(m_tp.model())) {
    env.opt.set_params(m_params);  // the rank steps what it holds: its slices and the replicated modules
    if (m_grid.dp > 1) {  // the replica's tensor-parallel group, and the slice's data-parallel group
      m_tp_transport = std::make_unique<GroupTransport>(env.transport, m_grid.tensor_group(env.rank), "tp");
      m_tp_comm = env.comm.sub(*m_tp_transport);
      m_dp_transport = std::make_unique<GroupTransport>(env.transport, m_grid.data_group(env.rank), "dp");
      m_dp_comm = env.comm.sub(*m_dp_transport);
    }
  }

  // --init: rank 0 alone loaded it (run.cpp); its whole model goes to every rank, which takes its slices.
  void start() override {
    if (m_env.cfg.init.empty()) return;
    broadcast_state(m_env.model, m_env.comm);
    m_tp.load(m_env.model);
  }

  std::vector<std::vector<int64_t>> batches(int64_t epoch) override {
    m_sampler.set_epoch(epoch);
    return make_batches(m_sampler.indices(), m_env.cfg.batch_size, m_env.cfg.drop_last);
  }
  int64_t samples_per_epoch() const override { return m_sampler.num_samples(); }

  // The hint the rank loop gave the whole model's BatchNorm layers for a batch of one (the rank's
  // own compute: its copies and slices, in the same order)
  void before_step(const StepInput&) override {
    const std::vector<BatchNorm*> whole = m_env.model.batchnorms(), mine = m_tp.model().batchnorms();
    for (size_t i = 0; i < whole.size() && i < mine.size(); ++i) mine[i]->set_error_hint(whole[i]->error_hint());
  }

  StepCount step(const StepInput& in, StepRecord& rec) override {
    Model& model = m_tp.model();
    m_step = in.step;
    int correct = 0;
    m_compute.begin(Phase::Forward, "forward", m_step);
    const float loss = model.forward_loss(*in.x, *in.labels, &correct);
    m_compute.end();
    m_env.memory_at("forward");
    m_env.faults.check(m_env.rank, in.step, "backward");
    m_compute.begin(Phase::Backward, "backward", m_step);
    model.zero_grad();
    model.backward_from_loss();
    m_compute.end();
    m_env.memory_at("backward");
    // A NaN or infinite gradient stops the run here, naming it (every rank computed the same loss;
    // a rank's slices have gradients of their own)
    for (size_t i = 0; i < m_params.size(); ++i)
      if (!all_finite(m_params[i]->grad))
        throw TrainingError("iteration " + std::to_string(in.step) + " (epoch " + std::to_string(in.epoch) + ", batch " +
                                std::to_string(in.batch) + "): the gradient of " + m_names[i] + " on rank " +
                                std::to_string(m_env.rank) + " is NaN or infinite (loss " + std::to_string(loss) + ")",
                            "lower --lr");
    if (m_dp_comm) average_over_replicas();
    m_env.comm.timed(Phase::OptimizerStep, "optimizer-step", in.step, [&] { m_env.opt.step(); });
    StepCount count = record_step(in, rec, loss, correct, -1.0, true, false, "");
    // every rank of a replica computed the same loss on the same batch: counted once, on its slice 0
    const bool counts = m_at.t == 0;
    count.counts = counts;
    count.samples = counts ? count.samples : 0;
    count.trained = counts ? count.trained : 0;
    // The whole model's BatchNorm layers (what the record reads) do not train here: the rank's
    // slices and copies do, and a local BatchNorm holds only the rank's features
    count.record_bn = false;
    return count;
  }

  // Checkpoints: the rank's slices and copies (its sliced model), its optimizer's state by their names.
  void save(ModeCheckpoint& mc) const override { save_slices(m_tp.model(), mc); }
  void restore(const ModeCheckpoint& mc, int64_t epochs_done) override {
    (void)epochs_done;
    restore_slices(m_tp.model(), mc, m_env.rank);
  }
  std::vector<std::string> optimizer_param_names() const override { return slice_param_names(m_tp.model(), m_params); }

  void before_evaluation() override { gather(); }
  void before_periodic_evaluation() override { gather(); }
  void finish() override { gather(); }

  // What a rank holds: its slices and the replicated modules (parameters, gradients), the
  // activations its forward saved. The whole model every rank keeps is dtlab's copy for evaluation
  // and saving (a Megatron rank evaluates with its slices): not counted.
  void measure_memory(MemoryBytes& b) const override {
    int64_t params = 0;
    for (const Param* p : m_params) params += p->value.numel() * 4;
    b[kMemParameters] = params;
    b[kMemGradients] = params;
    b[kMemActivations] = m_tp_model->activation_bytes();
  }

 private:
  // The communicator of the replica's tensor-parallel ranks (the world's without --dp).
  Communicator& tp_comm() { return m_tp_comm ? *m_tp_comm : m_env.comm; }

  // f's and g's allreduce: a collective of the tensor-parallel group, between compute events.
  void allreduce_sum(float* data, size_t count, const char* what, int tag) override {
    m_compute.pause();
    allreduce_over_group(data, count, CollectiveInfo{what, tag}, tp_comm(), m_env.comm);
    m_compute.resume();
  }

  // Data parallelism over the replicas (--dp): the gradients of what the rank holds (its slices and
  // its copies of the replicated modules), averaged over the slice's data-parallel group (the same
  // slice of every replica) as DDP's one bucket is, then the step.
  void average_over_replicas() {
    average_over_group(m_params, *m_dp_comm, m_env.comm, m_at.t, m_flat);
    m_env.memory_at("backward: allreduce over the replicas");
  }

  // Every slice into every rank's whole model, over the replica's tensor-parallel group. Under --dp
  // every replica holds the same parameters; BatchNorm's running statistics are each replica's own,
  // and rank 0's (replica 0's) are the ones evaluated and saved, as DDP's rank 0's.
  void gather() {
    gather_slices(m_tp, tp_comm(), m_env.comm, m_env.model);
    m_env.model.host_changed(kStateModel);
  }

  RankEnv& m_env;
  const GridShape m_grid;  // --dp replicas x the tensor-parallel ranks
  const GridCoords m_at;   // this rank's replica (d) and slice (t)
  DistributedSampler m_sampler;
  TensorParallelModel m_tp;
  const Model* m_tp_model = &m_tp.model();
  std::vector<Param*> m_params;     // the rank's model's parameters, which its optimizer steps
  std::vector<std::string> m_names;  // their state_dict names ("1.weight")
  std::vector<float> m_flat;                // average_over_replicas()'s bucket, freed after it
  std::unique_ptr<GroupTransport> m_tp_transport, m_dp_transport;  // --dp > 1: the rank's two groups
  std::unique_ptr<Communicator> m_tp_comm, m_dp_comm;
  int64_t m_step = -1;
  ComputeSegments m_compute{m_env.comm, m_env.rank};  // forward and backward, cut around the collectives
};

// The allreduces f and g ran, as recorded: per rank and iteration, how many and their bytes (the
// buffer allreduced, and what the rank sent for it).
struct TpCounts {
  int forward = 0, backward = 0;
  uint64_t forward_bytes = 0, backward_bytes = 0, sent = 0;
  bool operator==(const TpCounts& o) const {
    return forward == o.forward && backward == o.backward && forward_bytes == o.forward_bytes &&
           backward_bytes == o.backward_bytes;
  }
};

std::map<std::pair<int, int64_t>, TpCounts> counts_by_rank_and_step(const std::vector<std::vector<Event>>& events) {
  std::map<std::pair<int, int64_t>, TpCounts> out;
  for (const auto& rank_events : events)
    for (const Event& e : rank_events) {
      if (e.train_step < 0) continue;
      const bool fwd = std::strcmp(e.what, kTpActivations) == 0, bwd = std::strcmp(e.what, kTpInputGrads) == 0;
      if (!fwd && !bwd) continue;
      TpCounts& c = out[{e.rank, e.train_step}];
      if (e.kind == EventKind::Chunk && e.src == e.rank) c.sent += e.bytes;
      if (e.kind != EventKind::Collective) continue;
      (fwd ? c.forward : c.backward) += 1;
      (fwd ? c.forward_bytes : c.backward_bytes) += e.bytes;
    }
  return out;
}

class TensorMode : public ParallelMode {
 public:
  const char* name() const override { return "tensor"; }
  const char* title() const override { return "Megatron-LM tensor parallelism"; }
  const char* help() const override { return "tensor parallelism: layers split over the ranks (Megatron-LM)"; }
  const char* about() const override {
    return "Tensor parallelism (Megatron-LM): every rank computes on the same batch with its slice of each split "
           "layer. The first layer of a pair is split by its outputs (column-parallel), the second by its inputs "
           "(row-parallel); the row layer's partial outputs are allreduced in forward (g), the column layer's input "
           "gradients in backward (f). BatchNorm between them is exact on each rank's features; the other modules "
           "run whole on every rank.";
  }
  ModeCaps caps() const override {
    ModeCaps k;
    k.distributed_sampler = false;
    k.counts_trained_samples = k.one_loader = k.checkpoints = true;
    return k;
  }
  std::vector<ModeSetting> settings() const override {
    const ModeSetting tp = grid_tp_setting(
        "Ranks each split layer is cut over (0: the world size over --dp): it must divide the split sizes (mlp: 256; "
        "cnn: 32 and 128).");
    const ModeSetting dp = grid_dp_setting(
        "Data-parallel replicas of the tensor-parallel ranks: each slice's gradients averaged over them (DDP), world "
        "size = tp x dp.");
    return {tp, dp};
  }
  void validate_settings(const RunConfig& c) const override {
    if (c.tp < 0) throw ConfigError("--tp must be at least 1, got " + std::to_string(c.tp));
  }
  void validate(const RunConfig& c) const override {
    if (c.dp < 1) throw ConfigError("--dp must be at least 1, got " + std::to_string(c.dp));
    if (c.tp > 0 && c.tp * c.dp != c.world_size)
      throw ConfigError("--tp " + std::to_string(c.tp) + (c.dp > 1 ? " x --dp " + std::to_string(c.dp) : "") +
                            " with --world-size " + std::to_string(c.world_size),
                        "tensor parallelism here has one rank per slice of each split layer in each data-parallel "
                        "replica: --world-size is tp x dp (leave it out and it follows)");
    if (c.world_size % c.dp != 0)
      throw ConfigError("--world-size " + std::to_string(c.world_size) + " is not a multiple of --dp " + std::to_string(c.dp),
                        "every data-parallel replica has the same tensor-parallel ranks");
    if (!parse_device(c.compute.device).is_cpu())
      throw ConfigError("--mode tensor runs on the CPU reference only, not --device " + c.compute.device,
                        "its ranks run the CPU's modules on their slices; use --device cpu");
    if (c.nondeterministic)
      throw ConfigError("--nondeterministic with --mode tensor",
                        "the replicated layers must compute the same bits on every rank (nothing sends their "
                        "gradients between ranks); gradient sums in an order drawn per rank would make the ranks' "
                        "copies drift apart");
    if (c.bn == "sync")
      throw ConfigError("--bn sync with --mode tensor",
                        "every rank normalizes the same whole batch: BatchNorm's statistics are the batch's already "
                        "(a local BatchNorm on the rank's features, the others whole), there is nothing to synchronize");
    std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
    (void)plan_for(c, *m);  // --tp that does not divide a split layer, by name
  }
  std::string no_effect_reason(const RunConfig& c, const std::string& setting) const override {
    (void)c;
    if (setting == "sampler_drop_last")
      return "every rank reads the same batches of the whole dataset: there is no shard to pad or cut";
    return "";
  }
  std::string describe(const RunConfig& c) const override {
    const int T = tp_of(c);
    return "tensor parallel, " + std::to_string(T) + (T == 1 ? " rank" : " ranks") +
           (c.dp > 1 ? " x " + std::to_string(c.dp) + " data-parallel replicas" : "") + ", " + c.allreduce + " allreduce";
  }
  std::string header(const RunConfig& c) const override {
    std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
    std::string h = " tp=" + std::to_string(tp_of(c)) + (c.dp > 1 ? " dp=" + std::to_string(c.dp) : "") +
                    "\nsplit: " + tp_plan_text(plan_for(c, *m));
    if (c.dp > 1)  // Megatron-LM's placement: a replica's slices on neighbouring ranks
      h += "\nranks: " + grid_placement_text(grid_of(c)) +
           " (the ranks of a replica allreduce activations; slice t of every replica allreduces its gradients)";
    return h;
  }
  std::unique_ptr<RankMode> make_rank(RankEnv& env) const override { return std::make_unique<TensorRank>(env); }
  int64_t rank_parameters(const RunConfig& c, int rank) const override {
    if (rank < 0 || rank >= c.world_size) return -1;
    std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
    struct None final : TpCollectives {
      void allreduce_sum(float*, size_t, const char*, int) override {}
    } none;
    TensorParallelModel tp(*m, plan_for(c, *m), grid_of(c).coords(rank).t, none);
    int64_t n = 0;
    for (Param* p : tp.model().params()) n += p->value.numel();
    return n;
  }
  SyncCollectives sync_collectives() const override { return {"allreduce", {kTpActivations, kTpInputGrads}}; }
  void summary(const SummaryEnv& env, nlohmann::json& j) const override;
  std::vector<std::string> summary_lines(const RunConfig& c, const RunSummary& s) const override;
};

void TensorMode::summary(const SummaryEnv& env, nlohmann::json& j) const {
  const RunConfig& c = env.cfg;
  std::unique_ptr<Model> model = build_model(model_options(c), c.seed);
  const TpPlan plan = plan_for(c, *model);
  nlohmann::json modules = nlohmann::json::array();
  int64_t per_rank = 0, whole = 0;
  for (const TpModulePlan& m : plan.modules) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const TpTensorPlan& t : m.tensors) {
      if (t.is_int64) continue;
      tensors.push_back({{"name", t.name}, {"whole", t.whole}, {"shard", t.shard}, {"dim", t.dim}});
    }
    for (const Param* p : model->module(m.index).params()) whole += p->value.numel();
    for (size_t k = 0; k < m.tensors.size() && k < model->module(m.index).params().size(); ++k)
      per_rank += Tensor::numel_of(m.tensors[k].shard);
    nlohmann::json mj = {{"module", m.index}, {"layer", m.describe}, {"role", tp_role_name(m.role)}, {"tensors", tensors}};
    if (m.split > 0) mj["split"] = {{"size", m.split}, {"per_rank", m.split / plan.tp}};
    modules.push_back(mj);
  }
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& [col, row] : plan.pairs) pairs.push_back({{"column", col}, {"row", row}});
  // What ran: per rank and iteration, the allreduces and their bytes (every iteration alike, or
  // per_iteration is the first one's and uniform says they differ)
  const auto counted = counts_by_rank_and_step(env.events);
  nlohmann::json per_iteration = nullptr;
  bool uniform = true;
  std::vector<uint64_t> sent(static_cast<size_t>(c.world_size), 0);
  std::map<int64_t, int> ranks_per_step;
  for (const auto& [key, n] : counted) {
    if (key.first >= 0 && key.first < c.world_size) sent[static_cast<size_t>(key.first)] += n.sent;
    ++ranks_per_step[key.second];
  }
  if (!counted.empty()) {
    const TpCounts& first = counted.begin()->second;
    for (const auto& [key, n] : counted) uniform = uniform && n == first;
    per_iteration = {{"forward", first.forward}, {"backward", first.backward},
                     {"forward_bytes", first.forward_bytes}, {"backward_bytes", first.backward_bytes}};
  }
  const double steps = static_cast<double>(std::max<size_t>(1, ranks_per_step.size()));
  nlohmann::json sent_per_iteration = nlohmann::json::array();
  for (uint64_t b : sent) sent_per_iteration.push_back(static_cast<double>(b) / steps);
  if (c.dp > 1) j["grid"] = grid_summary(grid_of(c), env.events);
  j["tensor"] = {
      {"tp", plan.tp},
      {"dp", dp_of(c)},
      {"modules", modules},
      {"pairs", pairs},
      {"parameters", {{"whole", whole}, {"per_rank", per_rank}}},
      {"allreduces",
       {{"per_iteration", per_iteration},
        {"uniform", uniform},
        {"iterations_counted", ranks_per_step.size()},
        {"planned", {{"forward", plan.forward_allreduces()}, {"backward", plan.backward_allreduces()}}},
        {"sent_bytes_per_iteration", sent_per_iteration},
        {"what",
         "allreduces of one rank's iteration as recorded: forward, g after every row-parallel layer (partial "
         "outputs, \"tp activations\"); backward, f before every column-parallel layer whose input needs a gradient "
         "(\"tp input grads\": none for the model's first layer, whose input is data); bytes: the buffers allreduced; "
         "sent: what each rank sent for them per iteration, by the run's allreduce algorithm"}}},
      {"what",
       "Megatron-LM's split: column (outputs cut over the ranks), row (inputs cut; partial outputs summed by the "
       "allreduce, the bias added after it), local (BatchNorm, ReLU and MaxPool2d on a rank's own features), "
       "replicated (the whole module on every rank, identical values and gradients); shard: the shape a rank holds"}};
}

std::vector<std::string> TensorMode::summary_lines(const RunConfig& c, const RunSummary& s) const {
  std::unique_ptr<Model> model = build_model(model_options(c), c.seed);
  const TpPlan plan = plan_for(c, *model);
  uint64_t fwd = 0, bwd = 0;
  for (const TrafficStats::Part& p : s.traffic.by_what) {
    if (p.what == kTpActivations) fwd = p.bytes_moved;
    if (p.what == kTpInputGrads) bwd = p.bytes_moved;
  }
  const double steps = static_cast<double>(std::max<int64_t>(1, s.steps));
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "tensor parallel over %d ranks: %d allreduce(s) per iteration in forward (g, after the row-parallel "
                "layers), %d in backward (f, before the column-parallel ones but the first); %.1f KiB moved per "
                "iteration over all ranks (forward %.1f, backward %.1f)",
                plan.tp, plan.forward_allreduces(), plan.backward_allreduces(),
                static_cast<double>(fwd + bwd) / steps / 1024.0, static_cast<double>(fwd) / steps / 1024.0,
                static_cast<double>(bwd) / steps / 1024.0);
  return {buf};
}

}  // namespace

std::unique_ptr<ParallelMode> make_tensor_mode() { return std::make_unique<TensorMode>(); }

}  // namespace lab
