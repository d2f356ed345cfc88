// --mode pipeline: the model cut into stages, one rank each, every mini-batch cut into micro-batches
// (torch.chunk) that flow through the stages by a schedule (pipeline.h): PyTorch 1.13's
// torch.distributed.pipeline.sync.Pipe (GPipe; checkpoint="never") and 1F1B.
//
// One rank's iteration, for stage s of P:
//   - its forwards and backwards of the micro-batches in its schedule's order: a forward takes its
//     input from the batch (stage 0) or from stage s - 1, a backward its output's gradient from the
//     loss (the last stage: nn.CrossEntropyLoss over the whole mini-batch, as Pipe's caller computes
//     it on the concatenated outputs) or from stage s + 1; activations and gradients travel between
//     ranks as point-to-point messages over the transport (send events in the trace); a send that
//     meets a receive from the same neighbour goes as one sendrecv (Megatron-LM's
//     send_forward_recv_backward), so no schedule deadlocks on a transport whose sends wait;
//   - every micro-batch in flight needs its own saved tensors: modules keep what their backward
//     needs as members, so each micro-batch runs on a replica of the stage's modules holding the
//     stage's own parameters (swapped in, not copied) and a gradient of its own;
//   - at the end the micro-batches' gradients are added in reverse micro-batch order (the order
//     autograd accumulates them in Pipe), so GPipe and 1F1B give the same bits, then the stage's
//     optimizer steps its own parameters;
//   - BatchNorm: each micro-batch is normalized with its own statistics and updates the running
//     statistics in turn (micro-batch m starts from m - 1's), or, --deferred-batch-norm, the
//     statistics are tracked and committed once per mini-batch (DeferredBatchNorm, pipeline.h).
// Before an evaluation and at the end, every stage broadcasts its parameters and buffers so each
// rank holds the whole model (the run evaluates and saves rank 0's).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

#include "batchnorm.h"
#include "communicator.h"
#include "data_parallel.h"
#include "grid.h"
#include "group_transport.h"
#include "dataset.h"
#include "device.h"
#include "errors.h"
#include "events.h"
#include "mode.h"
#include "mode_ddp.h"
#include "model.h"
#include "mutation.h"
#include "optim.h"
#include "pipeline.h"
#include "run.h"
#include "safetensors.h"
#include "sampler.h"
#include "state_pack.h"
#include "tensor_parallel.h"

namespace lab {

namespace {

int tp_of(const RunConfig& c) { return std::max(1, c.tp); }  // (0: no tensor parallelism)
int stages_of(const RunConfig& c) {
  return c.stages > 0 ? c.stages : c.world_size / (std::max(1, c.dp) * tp_of(c));
}

// The grid of --dp replicas of the pipeline, each stage over --tp slices (group_transport.h's
// placement: world rank = t + T (d + D p)).
GridShape grid_of(const RunConfig& c) {
  GridShape g;
  g.dp = std::max(1, c.dp);
  g.pp = stages_of(c);
  g.tp = tp_of(c);
  return g;
}

// Tensor parallelism inside the stages (--tp): Megatron-LM's split of the whole model
// (tensor_parallel.h), of which each stage computes its modules.
TpPlan tp_plan_for(const RunConfig& c, Model& model) { return tensor_parallel_plan(model, tp_of(c), c.model); }

// f and g with no one to sum with: a sliced model's forward for its shapes only.
struct NoCollectives final : TpCollectives {
  void allreduce_sum(float*, size_t, const char*, int) override {}
};

std::vector<PipelineStage> stages_for(const RunConfig& c, Model& model) {
  return pipeline_stages(model, stages_of(c), c.balance, c.model);
}

class PipelineRank : public RankMode, private TpCollectives {
 public:
  explicit PipelineRank(RankEnv& env)
      : m_env(env),
        m_grid(grid_of(env.cfg)),
        m_at(m_grid.coords(env.rank)),
        m_sampler({env.train.size, m_grid.dp, m_at.d, env.cfg.shuffle, env.cfg.seed, env.cfg.sampler_drop_last}),
        m_stages(stages_for(env.cfg, env.model)),
        m_stage(m_at.p),
        m_mine(m_stages[static_cast<size_t>(m_stage)]),
        m_last(m_stage + 1 == m_grid.pp),
        m_prev(m_stage > 0 ? m_grid.rank_of({m_at.d, m_stage - 1, m_at.t}) : -1),
        m_next(m_last ? -1 : m_grid.rank_of({m_at.d, m_stage + 1, m_at.t})),
        m_chunks(mutated("pipeline-whole-batch") ? 1 : static_cast<int>(env.cfg.microbatches)),
        m_deferred(env.cfg.deferred_batch_norm && !mutated("pipeline-deferred-bn-ignored")),
        m_schedule(mutated("pipeline-1f1b-is-gpipe") ? std::string("gpipe") : env.cfg.schedule) {
    std::unique_ptr<Model> whole = build_model(model_options(env.cfg), env.cfg.seed);
    std::vector<std::vector<int64_t>> shapes;
    if (m_grid.tp > 1) {  // the stage's modules are the rank's slices of the whole model's
      m_plan = tp_plan_for(env.cfg, env.model);
      m_tp = std::make_unique<TensorParallelModel>(env.model, m_plan, m_at.t, collectives());
      NoCollectives none;  // (what crosses a stage boundary may be a slice: the sliced model's shapes)
      shapes = TensorParallelModel(*whole, m_plan, m_at.t, none).model().module_output_shapes({1, 28, 28});
      m_tp_transport = std::make_unique<GroupTransport>(env.transport, m_grid.tensor_group(env.rank), "tp");
      m_tp_comm = env.comm.sub(*m_tp_transport);
    } else {
      shapes = whole->module_output_shapes({1, 28, 28});
    }
    m_in_shape = m_mine.begin == 0 ? std::vector<int64_t>{1, 28, 28} : shapes[m_mine.begin - 1];
    m_out_shape = shapes[m_mine.end - 1];
    for (size_t i = m_mine.begin; i < m_mine.end; ++i) {
      Module& mod = stage_model().module(i);
      for (Param* p : mod.params()) m_params.push_back(p);
      for (Buffer* b : mod.buffers()) m_buffers.push_back(b);
      if (dynamic_cast<BatchNorm*>(&mod)) m_bns.push_back(i);
    }
    m_deferred_stats.resize(m_bns.size());
    env.opt.set_params(m_params);  // the stage's optimizer steps the stage's parameters
    if (m_grid.dp > 1) {  // the stage's data-parallel group: the same stage of every replica
      m_dp_transport = std::make_unique<GroupTransport>(env.transport, m_grid.data_group(env.rank), "dp");
      m_dp_comm = env.comm.sub(*m_dp_transport);
    }
  }

  // --init: rank 0 alone loaded it (run.cpp); its whole model goes to every rank, whose stage (and
  // slices of it) start from there.
  void start() override {
    if (m_env.cfg.init.empty()) return;
    broadcast_state(m_env.model, m_env.comm);
    if (m_tp) m_tp->load(m_env.model);
  }

  std::vector<std::vector<int64_t>> batches(int64_t epoch) override {
    m_sampler.set_epoch(epoch);
    return make_batches(m_sampler.indices(), m_env.cfg.batch_size, m_env.cfg.drop_last);
  }
  int64_t samples_per_epoch() const override { return m_sampler.num_samples(); }

  StepCount step(const StepInput& in, StepRecord& rec) override {
    Communicator& comm = m_env.comm;
    m_step = in.step;
    const int64_t batch = static_cast<int64_t>(in.indices->size());
    const std::vector<int64_t> sizes = torch_chunk_sizes(batch, m_chunks);
    const int micro = static_cast<int>(sizes.size());
    m_offsets.assign(sizes.size() + 1, 0);
    for (size_t i = 0; i < sizes.size(); ++i) m_offsets[i + 1] = m_offsets[i] + sizes[i];
    m_sizes = sizes;
    m_batch = batch;
    // Every rank takes 2 M sequence numbers (forward and backward messages of each micro-batch),
    // used or not: the numbers stay the same on every rank. The transport's tag is the first.
    m_seq0 = comm.next_seq();
    for (int i = 1; i < 2 * m_chunks; ++i) comm.next_seq();
    while (m_replicas.size() < static_cast<size_t>(micro)) add_replica();
    m_inputs.resize(static_cast<size_t>(micro));
    m_outputs.resize(static_cast<size_t>(micro));
    m_out_grads.resize(static_cast<size_t>(micro));
    m_in_grads.resize(static_cast<size_t>(micro));
    for (int m = 0; m < micro; ++m) zero_stage_grads(m_replicas[static_cast<size_t>(m)].model());
    m_loss_sum = 0;
    m_correct = 0;
    m_held.assign(static_cast<size_t>(micro), false);

    const std::vector<PipeStep> order = pipeline_schedule(m_schedule, m_grid.pp, m_stage, micro);
    m_received_input.assign(static_cast<size_t>(micro), false);
    m_received_grad.assign(static_cast<size_t>(micro), false);
    for (size_t k = 0; k < order.size(); ++k) {
      const PipeStep st = order[k];
      const PipeStep* next = k + 1 < order.size() ? &order[k + 1] : nullptr;
      if (st.op == PipeOp::Forward) {
        if (m_stage > 0 && !m_received_input[static_cast<size_t>(st.micro)]) recv_input(st.micro);
        forward(st.micro, in);
        if (!m_last) {  // the output goes to the next stage, with the receive of a gradient from it if one is next
          if (next && next->op == PipeOp::Backward) send_output_recv_grad(st.micro, next->micro);
          else send_output(st.micro);
        }
      } else {
        if (!m_last && !m_received_grad[static_cast<size_t>(st.micro)]) recv_grad(st.micro);
        backward(st.micro);
        if (m_stage > 0) {  // the input's gradient goes to the previous stage
          if (next && next->op == PipeOp::Forward) send_grad_recv_input(st.micro, next->micro);
          else send_grad(st.micro);
        }
      }
    }
    // The micro-batches' gradients, added in reverse micro-batch order, into the stage's
    comm.timed(Phase::OptimizerStep, "accumulate", m_step, [&] { accumulate(micro); });
    m_env.memory_at("backward");
    if (m_dp_comm) average_over_replicas();
    comm.timed(Phase::OptimizerStep, "optimizer-step", m_step, [&] { m_env.opt.step(); });
    m_env.model.host_changed(kStateParams);
    StepCount count = record_step(in, rec, m_last ? static_cast<float>(m_loss_sum / static_cast<double>(batch))
                                                 : std::numeric_limits<float>::quiet_NaN(),
                                  m_last ? m_correct : 0, -1.0, true, false, "");
    rec.chunks = sizes;
    // the loss is the last stage's (its slice 0's: every slice computed the same)
    count.counts = m_last && m_at.t == 0;
    count.samples = count.counts ? batch : 0;
    count.trained = m_stage == 0 && m_at.t == 0 ? batch : 0;  // the run's samples, counted once per replica
    // (a rank's model holds the other stages' layers too, stale until an evaluation shares them, and
    // its own BatchNorm layers computed on the micro-batches' replicas: no per-step statistics)
    count.record_bn = false;
    return count;
  }

  // Checkpoints: the stage's state is the model's (its stage's modules), or with --tp the rank's
  // sliced model's; deferred BatchNorm's sums of the micro-batches tracked so far carry over (a short
  // last batch's sums carry into the next mini-batch).
  void save(ModeCheckpoint& mc) const override {
    if (m_tp) save_slices(m_tp->model(), mc);
    if (!m_deferred) return;
    nlohmann::json d = nlohmann::json::array();
    for (size_t k = 0; k < m_deferred_stats.size(); ++k) {
      const DeferredBatchNormStats& s = m_deferred_stats[k];
      d.push_back({{"tracked", s.tracked()}, {"counter", s.counter()}});
      Tensor sum({static_cast<int64_t>(s.sum().size())}), sq({static_cast<int64_t>(s.sum_squares().size())});
      sum.data = s.sum();
      sq.data = s.sum_squares();
      mc.tensors.push_back(f32_tensor("pipeline.deferred." + std::to_string(k) + ".sum", sum));
      mc.tensors.push_back(f32_tensor("pipeline.deferred." + std::to_string(k) + ".sum_squares", sq));
    }
    mc.counters["pipeline_deferred"] = d;
  }
  void restore(const ModeCheckpoint& mc, int64_t epochs_done) override {
    (void)epochs_done;
    if (m_tp) restore_slices(m_tp->model(), mc, m_env.rank);
    if (!m_deferred) return;
    const nlohmann::json& d = mc.counters.at("pipeline_deferred");
    if (d.size() != m_deferred_stats.size())
      throw IoError("the checkpoint of rank " + std::to_string(m_env.rank) + " tracks " + std::to_string(d.size()) +
                    " deferred BatchNorm layers, its stage has " + std::to_string(m_deferred_stats.size()));
    auto floats = [&](const std::string& name) {
      for (const SafeTensor& t : mc.tensors)
        if (t.name == name) {
          std::vector<float> v(t.bytes.size() / sizeof(float));
          std::memcpy(v.data(), t.bytes.data(), v.size() * sizeof(float));
          return v;
        }
      throw IoError("the checkpoint of rank " + std::to_string(m_env.rank) + " has no '" + name +
                    "' (deferred BatchNorm's sums)");
    };
    for (size_t k = 0; k < m_deferred_stats.size(); ++k) {
      const std::string at = "pipeline.deferred." + std::to_string(k);
      m_deferred_stats[k].restore(floats(at + ".sum"), floats(at + ".sum_squares"), d[k].at("counter").get<int64_t>(),
                                  d[k].at("tracked").get<int>());
    }
  }
  std::vector<std::string> optimizer_param_names() const override {
    return m_tp ? slice_param_names(m_tp->model(), m_params) : std::vector<std::string>{};
  }

  // Every stage's parameters and buffers to every rank (the evaluation and the saved model are
  // rank 0's, which must be whole).
  void before_evaluation() override { share_stages(); }
  void before_periodic_evaluation() override { share_stages(); }
  void finish() override { share_stages(); }

  // The stage's parameters, their gradients and optimizer state, and the activations of the
  // micro-batches in flight: each replica's saved tensors, its input (received or cut from the
  // batch) and output. The replicas' own gradients are how dtlab keeps the micro-batches' sums in
  // one order; PyTorch accumulates into one .grad, and that is what is counted.
  void measure_memory(MemoryBytes& b) const override {
    int64_t params = 0, acts = 0;
    for (const Param* p : m_params) params += p->value.numel() * 4;
    for (size_t m = 0; m < m_held.size(); ++m) {
      if (!m_held[m]) continue;
      acts += m_replicas[m].model().activation_bytes() + m_inputs[m].numel() * 4 + m_outputs[m].numel() * 4;
    }
    b[kMemParameters] = params;
    b[kMemGradients] = params;
    b[kMemActivations] = acts;
  }

 private:
  // A replica of the model for one micro-batch in flight: its stage's modules compute with the
  // stage's parameters swapped in. Deferred BatchNorm: its BatchNorm layers keep no running
  // statistics (they normalize with the micro-batch's own either way); the stage tracks them.
  void add_replica() {
    ModelOptions o = model_options(m_env.cfg);
    if (m_deferred) o.bn.track_running_stats = false;
    Replica r;
    r.whole = build_model(o, m_env.cfg.seed);
    if (m_tp) {  // the rank's slices of it (their values are swapped in from the stage's)
      r.tp = std::make_unique<TensorParallelModel>(*r.whole, m_plan, m_at.t, collectives());
      r.whole.reset();
    }
    m_replicas.push_back(std::move(r));
  }
  // Swaps the stage's parameters (values only) and, without deferred BatchNorm, its buffers into
  // (and back out of) replica m: an O(1) exchange of storage, no copy.
  void swap_state(size_t m) {
    Model& r = m_replicas[m].model();
    size_t pi = 0, bi = 0;
    for (size_t i = m_mine.begin; i < m_mine.end; ++i) {
      for (Param* p : r.module(i).params()) std::swap(p->value, m_params[pi++]->value);
      if (m_deferred) continue;
      for (Buffer* b : r.module(i).buffers()) {
        Buffer* mine = m_buffers[bi++];
        std::swap(b->value, mine->value);
        std::swap(b->i64, mine->i64);
      }
    }
  }
  void zero_stage_grads(Model& r) {
    for (size_t i = m_mine.begin; i < m_mine.end; ++i)
      for (Param* p : r.module(i).params()) p->grad.zero();
  }

  void forward(int micro, const StepInput& in) {
    const size_t m = static_cast<size_t>(micro);
    const int64_t n = m_sizes[m], off = m_offsets[m];
    if (m_stage == 0) {  // the micro-batch: rows [off, off + n) of the batch (torch.chunk)
      const int64_t per = in.x->numel() / std::max<int64_t>(1, in.x->dim(0));
      std::vector<int64_t> shape = in.x->shape;
      shape[0] = n;
      m_inputs[m].resize(shape);
      std::memcpy(m_inputs[m].ptr(), in.x->ptr() + off * per, static_cast<size_t>(n * per) * sizeof(float));
    }
    Model& r = m_replicas[m].model();
    m_env.comm.timed(Phase::Forward, "forward", m_step, [&] {
      swap_state(m);
      struct Back {
        PipelineRank& self;
        size_t m;
        ~Back() { self.swap_state(m); }
      } back{*this, m};
      const Tensor& y = r.forward_range(m_mine.begin, m_mine.end, m_inputs[m], Mode::Train);
      if (m_deferred) track_deferred(r);
      if (m_last) {
        const std::vector<int> labels(in.labels->begin() + off, in.labels->begin() + off + n);
        int hits = 0;
        m_loss_sum += cross_entropy_part(y, labels, m_batch, &m_out_grads[m], &hits);
        m_correct += hits;
      } else {
        m_outputs[m] = y;
      }
    }, micro);
    m_held[m] = true;
    m_env.memory_at("forward " + std::to_string(micro));
  }

  void backward(int micro) {
    const size_t m = static_cast<size_t>(micro);
    Model& r = m_replicas[m].model();
    m_env.comm.timed(Phase::Backward, "backward", m_step, [&] {
      swap_state(m);
      struct Back {
        PipelineRank& self;
        size_t m;
        ~Back() { self.swap_state(m); }
      } back{*this, m};
      const Tensor* dx = r.backward_range(m_out_grads[m]);
      if (dx && m_stage > 0) m_in_grads[m] = *dx;
    }, micro);
    m_held[m] = false;
    m_outputs[m] = Tensor();
    if (m_stage > 0) m_inputs[m] = Tensor();
    m_env.memory_at("backward " + std::to_string(micro));
  }

  // Deferred BatchNorm: each of the stage's BatchNorm layers tracks its input's sums; after the
  // configured number of micro-batches, the stage's BatchNorm commits them to its running statistics.
  void track_deferred(Model& r) {
    for (size_t k = 0; k < m_bns.size(); ++k)
      if (m_deferred_stats[k].track(r.module_input(m_bns[k]), m_chunks))
        m_deferred_stats[k].commit(static_cast<BatchNorm&>(stage_model().module(m_bns[k])));
  }

  void accumulate(int micro) {
    for (size_t pi = 0; pi < m_params.size(); ++pi) {
      Tensor& g = m_params[pi]->grad;
      g.zero();
    }
    for (int m = micro; m-- > 0;) {
      Model& r = m_replicas[static_cast<size_t>(m)].model();
      size_t pi = 0;
      for (size_t i = m_mine.begin; i < m_mine.end; ++i)
        for (Param* p : r.module(i).params()) {
          float* g = m_params[pi++]->grad.ptr();
          const float* add = p->grad.ptr();
          for (size_t e = 0; e < p->grad.data.size(); ++e) g[e] += add[e];
        }
    }
  }

  // ---- point to point ----
  uint64_t tag() const { return m_seq0; }
  uint64_t act_bytes(int micro) const {
    int64_t per = 1;
    for (int64_t d : m_out_shape) per *= d;
    return static_cast<uint64_t>(m_sizes[static_cast<size_t>(micro)] * per) * sizeof(float);
  }
  uint64_t in_bytes(int micro) const {
    int64_t per = 1;
    for (int64_t d : m_in_shape) per *= d;
    return static_cast<uint64_t>(m_sizes[static_cast<size_t>(micro)] * per) * sizeof(float);
  }
  void shape_input(int micro) {
    std::vector<int64_t> shape{m_sizes[static_cast<size_t>(micro)]};
    shape.insert(shape.end(), m_in_shape.begin(), m_in_shape.end());
    m_inputs[static_cast<size_t>(micro)].resize(shape);
  }
  void shape_grad(int micro) {
    std::vector<int64_t> shape{m_sizes[static_cast<size_t>(micro)]};
    shape.insert(shape.end(), m_out_shape.begin(), m_out_shape.end());
    m_out_grads[static_cast<size_t>(micro)].resize(shape);
  }
  // The event of one message this rank sends (the receiver records none): op "send", what it carries.
  Event send_event(int dst, int micro, bool forward, uint64_t bytes) const {
    Event e;
    e.kind = EventKind::Chunk;
    e.phase = Phase::Send;
    e.op = "send";
    e.what = forward ? "activations" : "activation grads";
    e.group = "pp";  // (the pipeline's neighbours: one of its groups in a grid)
    e.rank = m_env.rank;
    e.src = m_env.rank;
    e.dst = dst;
    e.chunk = micro;
    e.tag = micro;
    e.op_seq = m_seq0 + static_cast<uint64_t>((forward ? 0 : m_chunks) + micro);
    e.train_step = m_step;
    e.bytes = bytes;
    return e;
  }
  // Runs one point-to-point call; a transport error fails the world naming the stage, what it moved
  // and the step. Sends are recorded (and pass the run's step gate); receives are not.
  template <class F>
  void transfer(Event e, F&& f) {
    if (e.dst >= 0) m_env.comm.gate(e);
    e.t_start = now_seconds();
    try {
      f();
    } catch (const CommError& err) {
      m_env.transport.abort(err.what());
      throw CommError("rank " + std::to_string(m_env.rank) + " (stage " + std::to_string(m_stage) + "): the " +
                          std::string(e.what) + " of micro-batch " + std::to_string(e.chunk) + " at step " +
                          std::to_string(m_step) + ": " + err.what(),
                      err.hint());
    }
    e.t_end = now_seconds();
    if (e.dst >= 0) {
      m_env.comm.add_bytes_sent(e.bytes);
      m_env.comm.record(e);
    }
  }
  void recv_input(int micro) {
    shape_input(micro);
    Event e = send_event(-1, micro, true, 0);
    transfer(e, [&] { m_env.transport.recv(m_prev, m_inputs[static_cast<size_t>(micro)].ptr(), in_bytes(micro), tag()); });
    m_received_input[static_cast<size_t>(micro)] = true;
  }
  void recv_grad(int micro) {
    shape_grad(micro);
    Event e = send_event(-1, micro, false, 0);
    transfer(e, [&] {
      m_env.transport.recv(m_next, m_out_grads[static_cast<size_t>(micro)].ptr(), act_bytes(micro), tag());
    });
    m_received_grad[static_cast<size_t>(micro)] = true;
  }
  void send_output(int micro) {
    transfer(send_event(m_next, micro, true, act_bytes(micro)), [&] {
      m_env.transport.send(m_next, m_outputs[static_cast<size_t>(micro)].ptr(), act_bytes(micro), tag());
    });
  }
  void send_grad(int micro) {
    transfer(send_event(m_prev, micro, false, in_bytes(micro)), [&] {
      m_env.transport.send(m_prev, m_in_grads[static_cast<size_t>(micro)].ptr(), in_bytes(micro), tag());
    });
  }
  void send_output_recv_grad(int micro, int grad_micro) {
    shape_grad(grad_micro);
    transfer(send_event(m_next, micro, true, act_bytes(micro)), [&] {
      m_env.transport.sendrecv(m_next, m_outputs[static_cast<size_t>(micro)].ptr(), act_bytes(micro),
                               m_next, m_out_grads[static_cast<size_t>(grad_micro)].ptr(), act_bytes(grad_micro),
                               tag());
    });
    m_received_grad[static_cast<size_t>(grad_micro)] = true;
  }
  void send_grad_recv_input(int micro, int input_micro) {
    shape_input(input_micro);
    transfer(send_event(m_prev, micro, false, in_bytes(micro)), [&] {
      m_env.transport.sendrecv(m_prev, m_in_grads[static_cast<size_t>(micro)].ptr(), in_bytes(micro),
                               m_prev, m_inputs[static_cast<size_t>(input_micro)].ptr(), in_bytes(input_micro),
                               tag());
    });
    m_received_input[static_cast<size_t>(input_micro)] = true;
  }

  TpCollectives& collectives() { return *this; }  // (a private base: converted here)
  // The model whose stage modules the rank trains: the run's, or (--tp) the rank's slices.
  Model& stage_model() { return m_tp ? m_tp->model() : m_env.model; }

  // f's and g's allreduce (--tp): a collective of the stage's tensor-parallel group, inside the
  // micro-batch's forward or backward block (as in Megatron-LM, a stage's block includes them).
  void allreduce_sum(float* data, size_t count, const char* what, int tag) override {
    allreduce_over_group(data, count, CollectiveInfo{what, tag}, *m_tp_comm, m_env.comm);
  }

  // Every stage broadcasts its parameters and buffers (root: the stage's rank).
  void share_stages() {
    // (an evaluation's collectives, not an iteration's: the rank loop has set no step)
    if (m_tp) gather_slices(*m_tp, *m_tp_comm, m_env.comm, m_env.model);  // (then the others' are stale: see below)
    for (size_t s = 0; s < m_stages.size(); ++s) {
      const StatePack pack(m_env.model, kPackParams | kPackBuffers, m_stages[s].begin, m_stages[s].end);
      if (pack.bytes() == 0) continue;
      std::vector<uint8_t> bytes(pack.bytes());
      const int owner = m_grid.rank_of({0, static_cast<int>(s), 0});  // replica 0's stage s
      const bool root = owner == m_env.rank;
      if (root) pack.pack(bytes.data());
      m_env.comm.broadcast(bytes.data(), bytes.size(), owner, CollectiveInfo{"stage state", static_cast<int>(s)});
      if (!root) pack.unpack(bytes.data());
    }
    m_env.model.host_changed(kStateModel);
  }

  // Data parallelism over the replicas (--dp): the stage's gradients averaged over the stage's
  // data-parallel group as DDP's one bucket is, then the optimizer step.
  void average_over_replicas() {
    average_over_group(m_params, *m_dp_comm, m_env.comm, m_stage, m_flat);
    m_env.memory_at("backward: allreduce over the replicas");
  }

  RankEnv& m_env;
  const GridShape m_grid;   // --dp replicas x the stages
  const GridCoords m_at;    // this rank's replica (d) and stage (p)
  DistributedSampler m_sampler;
  const std::vector<PipelineStage> m_stages;
  const int m_stage;
  const PipelineStage m_mine;
  const bool m_last;
  const int m_prev, m_next;  // the world ranks of the previous and next stage of this replica (-1: none)
  std::unique_ptr<GroupTransport> m_dp_transport;  // --dp > 1: the stage's data-parallel group
  std::unique_ptr<Communicator> m_dp_comm;
  std::vector<float> m_flat;
  const int m_chunks;     // --microbatches: Pipe's chunks
  const bool m_deferred;  // --deferred-batch-norm
  const std::string m_schedule;  // --schedule (lessons' mutation tests: mutation.h)
  std::vector<int64_t> m_in_shape, m_out_shape;  // per sample: the stage's input and output
  std::vector<Param*> m_params;    // the stage's parameters (the model's), which its optimizer steps
  std::vector<Buffer*> m_buffers;  // the stage's buffers (BatchNorm's running statistics)
  std::vector<size_t> m_bns;       // the stage's BatchNorm modules
  std::vector<DeferredBatchNormStats> m_deferred_stats;
  // A micro-batch's model: a whole one, or (--tp) the rank's slices of one.
  struct Replica {
    std::unique_ptr<Model> whole;
    std::unique_ptr<TensorParallelModel> tp;
    Model& model() { return tp ? tp->model() : *whole; }
    const Model& model() const { return tp ? tp->model() : *whole; }
  };
  std::vector<Replica> m_replicas;  // one per micro-batch in flight
  // --tp > 1: the rank's slices of the whole model (the stage's are what it trains), its tensor group
  TpPlan m_plan;
  std::unique_ptr<TensorParallelModel> m_tp;
  std::unique_ptr<GroupTransport> m_tp_transport;
  std::unique_ptr<Communicator> m_tp_comm;
  // this iteration
  int64_t m_step = 0, m_batch = 0;
  uint64_t m_seq0 = 0;
  std::vector<int64_t> m_sizes, m_offsets;
  std::vector<Tensor> m_inputs, m_outputs, m_out_grads, m_in_grads;  // per micro-batch
  std::vector<bool> m_received_input, m_received_grad, m_held;
  double m_loss_sum = 0;
  int m_correct = 0;
};

class PipelineMode : public ParallelMode {
 public:
  const char* name() const override { return "pipeline"; }
  const char* title() const override { return "Pipe"; }
  const char* help() const override { return "pipeline parallelism: GPipe or 1F1B over stages"; }
  const char* about() const override {
    return "Pipeline parallelism (torch.distributed.pipeline.sync.Pipe): the model cut into stages, one rank each; "
           "every mini-batch cut into micro-batches that flow through the stages, forward then backward, by a "
           "schedule: gpipe (every forward, then every backward) or 1f1b (one forward, one backward). Stages wait "
           "for each other: the bubble.";
  }
  ModeCaps caps() const override {
    ModeCaps k;
    k.distributed_sampler = false;
    k.counts_trained_samples = k.one_loader = k.micro_batches = k.checkpoints = true;
    return k;
  }
  std::vector<ModeSetting> settings() const override {
    ModeSetting stages;
    stages.field = "stages";
    stages.flag = "--stages";
    stages.label = "stages";
    stages.min = 0;
    stages.pytorch = "Pipe's partitions";
    stages.help = "Stages, one rank each (0: the world size over --dp).";
    ModeSetting micro;
    micro.field = "microbatches";
    micro.flag = "--microbatches";
    micro.label = "microbatches";
    micro.min = 1;
    micro.pytorch = "chunks";
    micro.help = "Micro-batches per mini-batch (Pipe's chunks): more of them, a smaller bubble.";
    ModeSetting sched;
    sched.field = "schedule";
    sched.flag = "--schedule";
    sched.label = "schedule";
    sched.kind = ModeSetting::Kind::Choice;
    sched.pytorch = "schedule";
    sched.choices = {{"gpipe", "GPipe: every forward, then every backward (Pipe's)"},
                     {"1f1b", "1F1B: after p - s - 1 warm-up forwards, one forward and one backward alternate"}};
    sched.help = "The order each stage runs its micro-batches in: the same bubble, different activation memory.";
    ModeSetting balance;
    balance.field = "balance";
    balance.flag = "--balance";
    balance.label = "balance";
    balance.kind = ModeSetting::Kind::Choice;
    balance.pytorch = "balance";
    balance.help = "Modules per stage (torchgpipe's balance); empty: cut before layers, balancing their work.";
    balance.shown = [](const RunConfig&) { return false; };
    ModeSetting deferred;
    deferred.field = "deferred_batch_norm";
    deferred.flag = "--deferred-batch-norm";
    deferred.label = "deferred_batch_norm";
    deferred.kind = ModeSetting::Kind::Bool;
    deferred.pytorch = "deferred_batch_norm";
    deferred.help = "Pipe(deferred_batch_norm=True): running statistics once per mini-batch, not per micro-batch.";
    const ModeSetting dp = grid_dp_setting(
        "Data-parallel replicas of the whole pipeline: each stage's gradients averaged over them (DDP), world size = "
        "stages x dp x tp.");
    const ModeSetting tp = grid_tp_setting(
        "Tensor-parallel slices of every stage (0 or 1: none): Megatron-LM's split of the layers, each stage's over "
        "its own --tp ranks.");
    return {stages, micro, sched, balance, deferred, dp, tp};
  }
  void validate_settings(const RunConfig& c) const override {
    check_schedule_name(c.schedule);
    if (c.microbatches < 1) throw ConfigError("number of chunks must be positive integer", "--microbatches must be >= 1");
    if (c.stages < 0) throw ConfigError("--stages must be at least 1, got " + std::to_string(c.stages));
  }
  void validate(const RunConfig& c) const override {
    if (c.dp < 1) throw ConfigError("--dp must be at least 1, got " + std::to_string(c.dp));
    if (c.tp < 0) throw ConfigError("--tp must be at least 1, got " + std::to_string(c.tp));
    const int T = tp_of(c);
    if (c.stages > 0 && c.stages * c.dp * T != c.world_size)
      throw ConfigError("--stages " + std::to_string(c.stages) + " x --dp " + std::to_string(c.dp) +
                            (T > 1 ? " x --tp " + std::to_string(T) : "") + " with --world-size " +
                            std::to_string(c.world_size),
                        "a pipeline has one rank per stage (and per tensor-parallel slice of it) of each data-parallel "
                        "replica: --world-size is stages x dp x tp (leave it out and it follows)");
    if (c.world_size % (c.dp * T) != 0)
      throw ConfigError("--world-size " + std::to_string(c.world_size) + " is not a multiple of --dp " + std::to_string(c.dp) +
                            (T > 1 ? " x --tp " + std::to_string(T) : ""),
                        "every data-parallel replica of the pipeline has the same stages, each of --tp ranks");
    if (!parse_device(c.compute.device).is_cpu())
      throw ConfigError("--mode pipeline runs on the CPU reference only, not --device " + c.compute.device,
                        "its stages run the CPU's modules; use --device cpu");
    if (c.nondeterministic)
      throw ConfigError("--nondeterministic with --mode pipeline",
                        "no sum runs across ranks: each stage adds its micro-batches' gradients in one fixed order");
    if (c.bn == "sync")
      throw ConfigError("--bn sync with --mode pipeline",
                        "SyncBatchNorm needs a process group of data-parallel ranks; a pipeline's stages hold different "
                        "layers. Use --deferred-batch-norm for running statistics over the mini-batch");
    if (c.deferred_batch_norm && c.batchnorm && c.model == "mlp")
      throw ConfigError("expected at least 3D input (got 2D input)",
                        "--deferred-batch-norm: PyTorch's DeferredBatchNorm refuses BatchNorm1d on (N, C) inputs, which "
                        "the mlp's are; use --model cnn");
    std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
    (void)stages_for(c, *m);  // the stage map's errors, by name
    if (T > 1) (void)tp_plan_for(c, *m);  // --tp that does not divide a split layer, by name
  }
  std::string no_effect_reason(const RunConfig& c, const std::string& setting) const override {
    if (setting == "deferred_batch_norm" && (!c.batchnorm || !c.track_running_stats))
      return !c.batchnorm ? "the model has no BatchNorm (--no-batchnorm)"
                          : "BatchNorm keeps no running statistics (--no-track-running-stats)";
    if (setting == "schedule" && stages_of(c) == 1) return "with one stage there is nothing to schedule";
    if (setting == "sampler_drop_last")
      return "every stage reads the same batches of the whole dataset: there is no shard to pad or cut";
    return "";
  }
  std::string describe(const RunConfig& c) const override {
    const int P = stages_of(c);
    return "pipeline " + c.schedule + ", " + std::to_string(P) + (P == 1 ? " stage, " : " stages, ") +
           std::to_string(c.microbatches) + " micro-batches" +
           (c.tp > 1 ? ", " + std::to_string(c.tp) + " tensor-parallel slices each" : "") +
           (c.dp > 1 ? ", " + std::to_string(c.dp) + " data-parallel replicas" : "");
  }
  std::string header(const RunConfig& c) const override {
    std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
    const std::vector<PipelineStage> st = stages_for(c, *m);
    std::string h = " schedule=" + c.schedule + " microbatches=" + std::to_string(c.microbatches) + " balance=" +
                    balance_text(st) + (c.deferred_batch_norm ? " deferred_batch_norm" : "") +
                    (c.dp > 1 ? " dp=" + std::to_string(c.dp) : "") + (c.tp > 1 ? " tp=" + std::to_string(c.tp) : "") +
                    "\nstages: " + stage_map_text(*m, st);
    if (c.tp > 1) h += "\nsplit: " + tp_plan_text(tp_plan_for(c, *m));
    if (c.dp > 1 || c.tp > 1)  // where each replica's stages are: Megatron-LM's placement
      h += "\nranks: " + grid_placement_text(grid_of(c)) +
           (c.tp > 1 ? " (a stage's slices on neighbouring ranks allreduce its layers' activations; "
                     : " (") +
           "stage s of every replica allreduces its gradients)";
    return h;
  }
  int64_t rank_parameters(const RunConfig& c, int rank) const override {
    const GridShape g = grid_of(c);
    if (rank < 0 || rank >= g.size()) return -1;
    const GridCoords at = g.coords(rank);
    std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
    const PipelineStage st = stages_for(c, *m)[static_cast<size_t>(at.p)];
    std::unique_ptr<TensorParallelModel> tp;
    NoCollectives none;
    if (g.tp > 1) tp = std::make_unique<TensorParallelModel>(*m, tp_plan_for(c, *m), at.t, none);
    Model& mine = tp ? tp->model() : *m;
    int64_t n = 0;
    for (size_t i = st.begin; i < st.end; ++i)
      for (Param* p : mine.module(i).params()) n += p->value.numel();
    return n;
  }
  void resolve(RunConfig& c) const override {
    if (!c.balance.empty()) return;
    std::unique_ptr<Model> m = build_model(model_options(c), c.seed);
    c.balance = balance_text(stages_for(c, *m));
  }
  std::unique_ptr<RankMode> make_rank(RankEnv& env) const override { return std::make_unique<PipelineRank>(env); }
  SyncCollectives sync_collectives() const override { return {"", {"activations", "activation grads"}}; }
  void summary(const SummaryEnv& env, nlohmann::json& j) const override;
  std::vector<std::string> summary_lines(const RunConfig& c, const RunSummary& s) const override;
};

// The iteration's blocks as the timeline recorded them: per step, per stage, the forward and
// backward compute events (tag: the micro-batch), and each stage's order of them.
struct StepBlocks {
  std::vector<double> busy;  // per stage
  std::vector<double> fwd, bwd;  // per stage: the forward and backward blocks' seconds
  std::vector<int64_t> nf, nb;   // ... and how many
  double t0 = 1e300, t1 = -1e300;
  std::vector<std::vector<std::pair<double, PipeStep>>> order;  // per stage: (start, block)
  std::vector<std::vector<PipeStep>> orders() const {
    std::vector<std::vector<PipeStep>> out;
    for (auto o : order) {
      std::stable_sort(o.begin(), o.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      out.emplace_back();
      for (const auto& x : o) out.back().push_back(x.second);
    }
    return out;
  }
};

// (replica 0's stages: rank stage_rank[s] is stage s)
std::map<int64_t, StepBlocks> blocks_by_step(const std::vector<std::vector<Event>>& events, const GridShape& g) {
  const int stages = g.pp;
  std::map<int64_t, StepBlocks> out;
  for (const auto& rank_events : events)
    for (Event e : rank_events) {
      if (e.rank < 0 || e.rank >= g.size() || g.coords(e.rank).d != 0 || g.coords(e.rank).t != 0) continue;
      e.rank = g.coords(e.rank).p;
      if (e.kind != EventKind::Compute || e.train_step < 0 || e.tag < 0) continue;
      if (e.phase != Phase::Forward && e.phase != Phase::Backward) continue;
      StepBlocks& b = out[e.train_step];
      const size_t n = static_cast<size_t>(stages), r = static_cast<size_t>(e.rank);
      if (b.busy.empty()) {
        b.busy.assign(n, 0.0), b.fwd.assign(n, 0.0), b.bwd.assign(n, 0.0);
        b.nf.assign(n, 0), b.nb.assign(n, 0), b.order.resize(n);
      }
      if (e.rank < 0 || e.rank >= stages) continue;
      b.busy[r] += e.t_end - e.t_start;
      if (e.phase == Phase::Forward) b.fwd[r] += e.t_end - e.t_start, ++b.nf[r];
      else b.bwd[r] += e.t_end - e.t_start, ++b.nb[r];
      b.order[static_cast<size_t>(e.rank)].push_back(
          {e.t_start, PipeStep{e.phase == Phase::Forward ? PipeOp::Forward : PipeOp::Backward, e.tag}});
      b.t0 = std::min(b.t0, e.t_start);
      b.t1 = std::max(b.t1, e.t_end);
    }
  return out;
}

void PipelineMode::summary(const SummaryEnv& env, nlohmann::json& j) const {
  const RunConfig& c = env.cfg;
  const GridShape grid = grid_of(c);
  const int P = grid.pp, M = static_cast<int>(c.microbatches);
  std::unique_ptr<Model> model = build_model(model_options(c), c.seed);
  const std::vector<PipelineStage> st = stages_for(c, *model);
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < st.size(); ++s) {
    nlohmann::json mods = nlohmann::json::array();
    for (size_t i = st[s].begin; i < st[s].end; ++i) mods.push_back(std::to_string(i) + ": " + model->module(i).describe());
    stages.push_back({{"stage", s}, {"modules", mods},
                      {"in_flight_peak", peak_in_flight(pipeline_schedule(c.schedule, P, static_cast<int>(s), M))}});
  }
  // The measured bubble of each iteration (its compute blocks against the iteration's span over
  // every stage), and the blocks' mean times per stage for the schedule played with them
  std::vector<double> bubbles;
  std::vector<double> fwd(static_cast<size_t>(P), 0.0), bwd(static_cast<size_t>(P), 0.0);
  std::vector<int64_t> nf(static_cast<size_t>(P), 0), nb(static_cast<size_t>(P), 0);
  const std::map<int64_t, StepBlocks> steps = blocks_by_step(env.events, grid);
  for (const auto& [step, b] : steps) {
    bubbles.push_back(measured_bubble(b.busy, b.t1 - b.t0));
    for (size_t r = 0; r < static_cast<size_t>(P); ++r)
      fwd[r] += b.fwd[r], bwd[r] += b.bwd[r], nf[r] += b.nf[r], nb[r] += b.nb[r];
  }
  for (size_t r = 0; r < static_cast<size_t>(P); ++r) {
    fwd[r] = nf[r] ? fwd[r] / static_cast<double>(nf[r]) : 0.0;
    bwd[r] = nb[r] ? bwd[r] / static_cast<double>(nb[r]) : 0.0;
  }
  nlohmann::json bubble = {{"formula", bubble_formula(P, M)},
                           {"schedule", simulate_pipeline(c.schedule, P, M, 1.0, 2.0).bubble}};
  if (!bubbles.empty()) {
    std::vector<double> sorted = bubbles;
    std::sort(sorted.begin(), sorted.end());
    bubble["measured_median"] = sorted[sorted.size() / 2];
    bubble["measured_per_step"] = bubbles;
    bubble["schedule_measured_costs"] = simulate_pipeline(c.schedule, P, M, fwd, bwd).bubble;
  }
  // What the stages did: the first recorded iteration's order of blocks on each stage, played with
  // equal stages (its bubble and micro-batches in flight are the schedule's unless the run
  // departed from it)
  nlohmann::json as_run = nullptr;
  if (!steps.empty()) {
    const StepBlocks& first = steps.begin()->second;
    try {
      const PipeTimeline t = simulate_orders(first.orders(), std::vector<double>(static_cast<size_t>(P), 1.0),
                                             std::vector<double>(static_cast<size_t>(P), 2.0));
      int micro = 0;
      for (const auto& o : first.orders())
        for (const PipeStep& x : o) micro = std::max(micro, x.micro + 1);
      as_run = {{"step", steps.begin()->first}, {"micro_batches", micro}, {"bubble", t.bubble},
                {"in_flight_peak", t.peak_in_flight}};
    } catch (const Error&) {
      as_run = nullptr;  // events of an incomplete iteration
    }
  }
  bubble["as_run"] = as_run;
  bubble["what"] =
      "the idle share of the stages over an iteration: formula (p-1)/(m+p-1); schedule: the schedule played with "
      "equal stages (forward 1, backward 2) and free messages; schedule_measured_costs: played with each stage's "
      "mean measured forward and backward; measured: 1 - the stages' busy time / (stages x the iteration's span); "
      "as_run: each stage's recorded order of blocks in the first iteration, played with equal stages (with --dp: "
      "data-parallel replica 0's stages)";
  nlohmann::json placement = nlohmann::json::array();  // per replica, the ranks of its stages
  for (int d = 0; d < grid.dp; ++d) {
    nlohmann::json ranks = nlohmann::json::array();
    for (int p = 0; p < grid.pp; ++p) ranks.push_back(grid.rank_of({d, p, 0}));
    placement.push_back(ranks);
  }
  // Bytes per iteration in each process group (pp: the activations and their gradients between
  // stages; dp: the stages' gradient allreduces over the replicas), over the training iterations
  const nlohmann::json grid_j = grid_summary(grid, env.events);
  const nlohmann::json& per_group = grid_j["bytes_per_iteration_by_group"];
  j["grid"] = grid_j;
  j["pipeline"] = {{"schedule", c.schedule}, {"stages", stages}, {"microbatches", M}, {"balance", balance_text(st)},
                   {"dp", grid.dp}, {"replica_ranks", placement}, {"bytes_per_iteration_by_group", per_group},
                   {"deferred_batch_norm", c.deferred_batch_norm}, {"bubble", bubble},
                   {"forward_seconds", fwd}, {"backward_seconds", bwd}};
}

std::vector<std::string> PipelineMode::summary_lines(const RunConfig& c, const RunSummary& s) const {
  (void)s;
  const int P = stages_of(c), M = static_cast<int>(c.microbatches);
  std::string peaks;
  for (int st = 0; st < P; ++st)
    peaks += (st ? ", " : "") + std::to_string(peak_in_flight(pipeline_schedule(c.schedule, P, st, M)));
  char buf[160];
  std::snprintf(buf, sizeof buf, "pipeline %s: bubble (p-1)/(m+p-1) = %.3f; micro-batches in flight per stage at most: ",
                c.schedule.c_str(), bubble_formula(P, M));
  return {buf + peaks};
}

}  // namespace

std::unique_ptr<ParallelMode> make_pipeline_mode() { return std::make_unique<PipelineMode>(); }

}  // namespace lab
