#include "step_sim.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp.h"
#include "errors.h"
#include "group_transport.h"
#include "model.h"
#include "pipeline.h"
#include "tensor_parallel.h"

namespace lab {

int64_t StepModel::parameters() const {
  int64_t p = 0;
  for (const auto& l : layers) p += l.params();
  return p;
}

double StepModel::flops_per_sample() const {
  double f = 0;
  for (const auto& l : layers) f += l.fwd_flops + l.bwd_flops;
  return f;
}

StepModel step_model_dtlab(const std::string& name) {
  ModelOptions mo;
  mo.name = name;
  std::unique_ptr<Model> built = build_model(mo, 0);  // (throws ConfigError for another name)
  std::shared_ptr<Model> model(std::move(built));
  StepModel m;
  m.name = name;
  m.model = model;
  m.describe = model->describe();
  const std::vector<int64_t> sample = {1, 28, 28};
  const std::vector<int64_t> macs = model->module_macs(sample);
  const std::vector<std::vector<int64_t>> shapes = model->module_output_shapes(sample);
  const Model::ParamLayout layout = model->param_layout();
  const std::vector<Param*> params = model->params();
  m.input_bytes = 28.0 * 28.0 * 4;
  for (size_t i = 0; i < model->size(); ++i) {
    StepLayer l;
    l.what = model->module(i).describe();
    // Model::train_flops_per_sample's count, layer by layer: forward and weight gradients 2 x MACs
    // each; input gradients 2 x MACs for a layer with parameters after the first one
    const double mac = static_cast<double>(macs[i]);
    l.fwd_flops = 2 * mac;
    l.bwd_flops = 2 * mac + (layout.count[i] > 0 && i > layout.first_with_params ? 2 * mac : 0.0);
    for (int p = 0; p < layout.count[i]; ++p)
      l.tensors.push_back(params[static_cast<size_t>(layout.first[i] + p)]->value.numel());
    double out = 4;
    for (int64_t d : shapes[i]) out *= static_cast<double>(d);
    l.out_bytes = out;
    m.layers.push_back(std::move(l));
  }
  for (const StateEntry& e : model->state_dict())
    if (e.buffer) m.buffer_bytes += e.buffer->is_int64 ? 8.0 : 4.0 * static_cast<double>(e.buffer->value.numel());
  return m;
}

StepModel step_model_generic(const GenericModelSpec& g) {
  if (!(g.parameters >= 1)) throw ConfigError("--params must be at least 1 (parameters of the model), got " + std::to_string(g.parameters));
  if (!(g.flops_per_sample > 0))
    throw ConfigError("--flops-per-sample must be > 0 (a training step's FLOPs per sample: about 6 x parameters x "
                      "tokens for a transformer)");
  if (g.layers < 1) throw ConfigError("--layers must be at least 1, got " + std::to_string(g.layers));
  if (!(g.activation_bytes >= 0)) throw ConfigError("--activation-bytes must be >= 0");
  if (!(g.grad_bytes > 0)) throw ConfigError("--grad-bytes must be > 0");
  StepModel m;
  m.name = "generic";
  m.grad_bytes = g.grad_bytes;
  m.input_bytes = g.activation_bytes;
  char buf[200];
  std::snprintf(buf, sizeof buf, "generic: %.3g parameters, %.3g FLOPs per sample, %d layers, %.3g activation bytes "
                                 "per sample per boundary, %g bytes per gradient",
                g.parameters, g.flops_per_sample, g.layers, g.activation_bytes, g.grad_bytes);
  m.describe = buf;
  // four weight matrices per layer, as a transformer layer's (QKV, the attention's output, the
  // MLP's two): DDP's buckets hold whole tensors
  const int64_t per_tensor = static_cast<int64_t>(std::llround(g.parameters / g.layers / 4));
  for (int i = 0; i < g.layers; ++i) {
    StepLayer l;
    l.what = "layer " + std::to_string(i);
    l.fwd_flops = g.flops_per_sample / 3 / g.layers;
    l.bwd_flops = 2 * g.flops_per_sample / 3 / g.layers;
    l.tensors = {per_tensor, per_tensor, per_tensor, per_tensor};
    l.out_bytes = g.activation_bytes;
    m.layers.push_back(std::move(l));
  }
  return m;
}

StepCompute step_compute_from_run(const std::string& run_dir) {
  const std::string path = run_dir.size() >= 12 && run_dir.substr(run_dir.size() - 12) == "summary.json"
                               ? run_dir
                               : run_dir + "/summary.json";
  std::ifstream f(path);
  if (!f) throw IoError("--compute-from " + run_dir + ": cannot read " + path + " (a dtlab run directory has one)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw ConfigError("--compute-from " + run_dir + ": " + path + " is not JSON: " + e.what());
  }
  auto need = [&](const nlohmann::json& o, const char* key, const std::string& where) -> const nlohmann::json& {
    if (!o.is_object() || !o.contains(key))
      throw ConfigError("--compute-from " + run_dir + ": " + path + " has no " + where + key);
    return o.at(key);
  };
  const nlohmann::json& c = need(j, "compute", "");
  const double fw = need(c, "forward_seconds", "compute.").get<double>();
  const double bw = need(c, "backward_seconds", "compute.").get<double>();
  const double opt = need(c, "optimizer_seconds", "compute.").get<double>();
  const int ranks = static_cast<int>(need(c, "per_rank", "compute.").size());
  const double samples = need(j, "samples", "").get<double>();
  const double steps = need(j, "steps", "").get<double>();
  if (ranks < 1 || samples <= 0 || steps <= 0 || fw <= 0 || bw <= 0)
    throw ConfigError("--compute-from " + run_dir + ": " + path + " records no training compute (ranks " +
                      std::to_string(ranks) + ", samples " + std::to_string(samples) + ", steps " +
                      std::to_string(steps) + ")");
  const std::string mode = j.value("mode", std::string("ddp"));
  if (mode == "pipeline" || mode == "tensor")
    throw ConfigError("--compute-from " + run_dir + ": a --mode " + mode +
                      " run: its ranks compute parts of the model; give a run whose ranks compute the whole model "
                      "(--mode ddp, best with --world-size 1: its backward has no bucket waits)");
  StepCompute sc;
  const double per_rank = samples / ranks;
  sc.fwd_s_per_sample = fw / per_rank;
  sc.bwd_s_per_sample = bw / per_rank;
  sc.optimizer_s_per_step = opt / steps;
  sc.run_model = j.contains("model") ? j["model"].value("name", std::string()) : std::string();
  sc.run_device = j.contains("device") && j["device"].is_object() ? j["device"].value("device", std::string()) : "";
  sc.run_world_size = ranks;
  sc.run_batch_per_rank = static_cast<int64_t>(std::llround(per_rank / steps));
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "%s: compute.forward_seconds %.4g + backward_seconds %.4g (mean of %d rank%s) over samples %g / %d "
                "= %.4g s per sample forward, %.4g backward; optimizer_seconds %.4g / steps %g = %.4g s per step "
                "(model %s, device %s, %lld samples per rank per step)",
                path.c_str(), fw, bw, ranks, ranks == 1 ? "" : "s", samples, ranks, sc.fwd_s_per_sample,
                sc.bwd_s_per_sample, opt, steps, sc.optimizer_s_per_step, sc.run_model.c_str(),
                sc.run_device.empty() ? "?" : sc.run_device.c_str(), static_cast<long long>(sc.run_batch_per_rank));
  sc.source = buf;
  return sc;
}

const char* dp_sync_name(DpSync s) {
  switch (s) {
    case DpSync::Ddp: return "ddp";
    case DpSync::Zero: return "zero";
    case DpSync::Fsdp: return "fsdp";
  }
  return "?";
}

DpSync parse_dp_sync(const std::string& s, const std::string& flag) {
  for (auto d : {DpSync::Ddp, DpSync::Zero, DpSync::Fsdp})
    if (s == dp_sync_name(d)) return d;
  throw ConfigError(flag + " " + s + ": one of ddp, zero, fsdp");
}

std::string layout_text(const StepLayout& l) {
  return std::to_string(l.dp) + " x " + std::to_string(l.pp) + " x " + std::to_string(l.tp);
}

std::vector<StepLayout> all_layouts(int n) {
  std::vector<StepLayout> out;
  for (int dp = n; dp >= 1; --dp) {
    if (n % dp) continue;
    for (int pp = 1; pp <= n / dp; ++pp)
      if ((n / dp) % pp == 0) out.push_back({dp, pp, n / dp / pp});
  }
  return out;
}

double step_bubble_fraction(int stages, int micro) { return bubble_formula(stages, micro); }

namespace {

// One stage's work on one rank of a layout: its layers, with the rank's slices.
struct RankLayer {
  double fwd = 0, bwd = 0;            // FLOPs per sample (the rank's slices)
  std::vector<int64_t> tensors;       // the rank's elements of each parameter tensor
  std::vector<double> tp_fwd, tp_bwd; // allreduces over the tp group: bytes per sample
  double out_bytes = 0;               // the rank's output per sample
};
struct Stage {
  size_t begin = 0, end = 0;
  std::vector<RankLayer> layers;      // [begin, end)
  double send_bytes = 0;              // per sample, to the next stage
  int64_t params = 0;                 // the rank's
};

// The layers of a layout's rank, stage by stage. Throws ConfigError where the model cannot take it.
std::vector<Stage> plan_stages(const StepModel& m, int pp, int tp) {
  std::vector<RankLayer> layers(m.layers.size());
  if (m.model) {
    Model& model = *m.model;
    std::vector<TpRole> role(m.layers.size(), TpRole::Replicated);
    std::vector<std::vector<int64_t>> shard(m.layers.size());
    if (tp > 1) {
      const TpPlan plan = tensor_parallel_plan(model, tp, m.name);
      for (const TpModulePlan& mp : plan.modules) {
        role[mp.index] = mp.role;
        const size_t nparams = m.layers[mp.index].tensors.size();
        for (size_t k = 0; k < nparams && k < mp.tensors.size(); ++k) {
          int64_t e = 1;
          for (int64_t d : mp.tensors[k].shard) e *= d;
          shard[mp.index].push_back(e);
        }
      }
      for (const auto& [col, row] : plan.pairs) {
        layers[row].tp_fwd.push_back(m.layers[row].out_bytes);  // g: the row layer's partial outputs
        if (col != plan.first_with_params)                      // f: the column layer's input gradient
          layers[col].tp_bwd.push_back(col == 0 ? m.input_bytes : m.layers[col - 1].out_bytes);
      }
    }
    for (size_t i = 0; i < m.layers.size(); ++i) {
      const bool split = role[i] != TpRole::Replicated;
      layers[i].fwd = m.layers[i].fwd_flops / (split ? tp : 1);
      layers[i].bwd = m.layers[i].bwd_flops / (split ? tp : 1);
      layers[i].tensors = tp > 1 ? shard[i] : m.layers[i].tensors;
      layers[i].out_bytes = m.layers[i].out_bytes / (role[i] == TpRole::Column || role[i] == TpRole::Local ? tp : 1);
    }
  } else {
    for (size_t i = 0; i < m.layers.size(); ++i) {
      const StepLayer& l = m.layers[i];
      layers[i].fwd = l.fwd_flops / tp;
      layers[i].bwd = l.bwd_flops / tp;
      for (int64_t e : l.tensors) layers[i].tensors.push_back((e + tp - 1) / tp);
      layers[i].out_bytes = l.out_bytes;
      if (tp > 1)
        for (int k = 0; k < m.tp_allreduces_per_layer; ++k) {
          layers[i].tp_fwd.push_back(l.out_bytes);
          layers[i].tp_bwd.push_back(l.out_bytes);
        }
    }
  }
  std::vector<std::pair<size_t, size_t>> ranges;
  if (pp == 1) {
    ranges.push_back({0, m.layers.size()});
  } else if (m.model) {
    for (const PipelineStage& s : pipeline_stages(*m.model, pp, "", m.name)) ranges.push_back({s.begin, s.end});
  } else {
    const size_t L = m.layers.size();
    if (static_cast<size_t>(pp) > L)
      throw ConfigError("--pp " + std::to_string(pp) + ": more stages than the model's " + std::to_string(L) + " layers");
    for (int s = 0; s < pp; ++s) ranges.push_back({L * s / pp, L * (s + 1) / pp});
  }
  std::vector<Stage> out;
  for (const auto& [b, e] : ranges) {
    Stage st;
    st.begin = b;
    st.end = e;
    st.layers.assign(layers.begin() + static_cast<long>(b), layers.begin() + static_cast<long>(e));
    st.send_bytes = e > b ? layers[e - 1].out_bytes : 0;
    for (const RankLayer& l : st.layers)
      for (int64_t x : l.tensors) st.params += x;
    out.push_back(std::move(st));
  }
  out.back().send_bytes = 0;
  return out;
}

// The collectives of one layout: every group of an axis at once, the fastest allowed algorithm,
// cached.
class LayoutComm {
 public:
  LayoutComm(const Topology& t, const StepConfig& c, const StepLayout& l, StepCache* cache)
      : m_t(t), m_c(c), m_l(l), m_cache(cache ? cache : &m_own) {
    m_g.dp = l.dp, m_g.pp = l.pp, m_g.tp = l.tp;
    if (!c.algorithms.empty()) m_algos = c.algorithms;
    else if (c.protocol == SimProtocol::Wire) m_algos = {SimAlgorithm::Ring};
    else m_algos = {SimAlgorithm::Ring, SimAlgorithm::DbTree};
  }

  // The groups of axis 'd', 'p' or 't' of every rank, each once (ordered by their first member).
  std::vector<std::vector<int>> groups(char axis) const {
    std::vector<std::vector<int>> out;
    for (int r = 0; r < m_g.size(); ++r) {
      const std::vector<int> g = axis == 'd' ? m_g.data_group(r) : axis == 'p' ? m_g.pipeline_group(r) : m_g.tensor_group(r);
      if (g.front() == r) out.push_back(g);
    }
    return out;
  }
  // One collective of `bytes` over every group of an axis, or over the data-parallel groups of
  // stage `stage` only (stage >= 0: a pipeline's stages reduce their own gradients).
  const StepCache::Entry& collective(SimCollective coll, char axis, double bytes, int stage = -1) {
    const uint64_t b = static_cast<uint64_t>(std::max(0.0, bytes)) / 4 * 4;
    std::ostringstream key;
    key << m_t.nodes << "x" << m_t.gpus_per_node << "|" << layout_text(m_l) << "|" << sim_collective_name(coll) << "|"
        << axis << "|" << stage << "|" << b;
    auto it = m_cache->entries.find(key.str());
    if (it != m_cache->entries.end()) return it->second;
    std::vector<std::vector<int>> gs = groups(axis);
    if (stage >= 0)
      gs.erase(std::remove_if(gs.begin(), gs.end(), [&](const std::vector<int>& g) { return m_g.coords(g[0]).p != stage; }),
               gs.end());
    StepCache::Entry best;
    bool found = false;
    for (SimAlgorithm a : m_algos) {
      if (!sim_supports(a, coll, static_cast<int>(gs[0].size()))) continue;
      SimOptions so;
      so.collective = coll;
      so.algorithm = a;
      so.protocol = m_c.protocol;
      so.channels = m_c.channels;
      so.exact = m_c.exact;
      SimSchedule s;
      try {
        s = sim_schedule_groups(m_t, so, b, gs);
      } catch (const ConfigError&) {
        continue;  // (dbtree, hier: unequal members per node)
      }
      const SimResult r = sim_time_groups(m_t, so, s, b, gs);
      if (!found || r.time_s < best.r.time_s) {
        best.r = r;
        best.algo = a;
        best.sent = sim_traffic(s, m_t.ranks()).sent;
        found = true;
      }
    }
    if (!found) {  // none of the allowed runs it: the ring does
      SimOptions so;
      so.collective = coll;
      so.protocol = m_c.protocol;
      so.channels = m_c.channels;
      so.exact = m_c.exact;
      const SimSchedule s = sim_schedule_groups(m_t, so, b, gs);
      best.r = sim_time_groups(m_t, so, s, b, gs);
      best.sent = sim_traffic(s, m_t.ranks()).sent;
    }
    return m_cache->entries.emplace(key.str(), std::move(best)).first->second;
  }
  // Every pipeline's stage `stage` sending `bytes` to stage `stage + 1` (dir +1) or back (dir -1),
  // all at once.
  const StepCache::Entry& p2p(int stage, int dir, double bytes) {
    const uint64_t b = static_cast<uint64_t>(std::max(0.0, bytes)) / 4 * 4;
    std::ostringstream key;
    key << m_t.nodes << "x" << m_t.gpus_per_node << "|" << layout_text(m_l) << "|p2p|" << stage << "|" << dir << "|" << b;
    auto it = m_cache->entries.find(key.str());
    if (it != m_cache->entries.end()) return it->second;
    std::vector<SimMessage> msgs;
    for (int d = 0; d < m_l.dp; ++d)
      for (int tt = 0; tt < m_l.tp; ++tt) {
        const int a = m_g.rank_of({d, stage, tt}), z = m_g.rank_of({d, stage + 1, tt});
        msgs.push_back(dir > 0 ? SimMessage{a, z, static_cast<double>(b), -1} : SimMessage{z, a, static_cast<double>(b), -1});
      }
    SimOptions so;
    so.protocol = m_c.protocol;
    so.channels = m_c.channels;
    StepCache::Entry e;
    e.r = simulate_messages(m_t, so, msgs);
    e.sent.assign(static_cast<size_t>(m_t.ranks()), 0.0);
    for (const SimMessage& msg : msgs) e.sent[static_cast<size_t>(msg.src)] += msg.bytes;
    return m_cache->entries.emplace(key.str(), std::move(e)).first->second;
  }
  const GridShape& grid() const { return m_g; }

 private:
  const Topology& m_t;
  const StepConfig& m_c;
  StepLayout m_l;
  StepCache* m_cache;
  StepCache m_own;
  GridShape m_g;
  std::vector<SimAlgorithm> m_algos;
};

// Per-rank bytes and time of one axis, added up over a step.
struct AxisTally {
  std::vector<double> sent;   // per rank
  std::vector<double> secs;   // per rank: seconds in this axis' communication
  std::vector<std::string> algos;
  std::vector<int> count;     // per rank: collectives (or sends) it takes part in
  void add(const StepCache::Entry& e, double times, const std::vector<int>& ranks_busy, bool name_algo = true) {
    if (count.empty()) count.assign(e.sent.size(), 0);
    for (size_t r = 0; r < e.sent.size(); ++r) sent[r] += e.sent[r] * times;
    for (int r : ranks_busy) {
      secs[static_cast<size_t>(r)] += e.r.time_s * times;
      count[static_cast<size_t>(r)] += static_cast<int>(std::lround(times));
    }
    if (name_algo) {
      const std::string a = sim_algorithm_name(e.algo);
      if (std::find(algos.begin(), algos.end(), a) == algos.end()) algos.push_back(a);
    }
  }
  AxisComm result() const {
    // (the busiest rank's seconds, bytes and count, each its own maximum)
    AxisComm a;
    for (double s : secs) a.seconds = std::max(a.seconds, s);
    for (double b : sent) a.bytes = std::max(a.bytes, b);
    for (int n : count) a.collectives = std::max(a.collectives, n);
    for (const auto& s : algos) a.algorithms += (a.algorithms.empty() ? "" : "+") + s;
    return a;
  }
};

// DDP's buckets over one rank's tensors (registration order across the stage's layers): indices
// into `tensor_bytes`, bucket by bucket, as PyTorch's Reducer (ddp.h: compute_bucket_assignment,
// reverse order, the first bucket 1 MiB); first_iteration: one bucket of every tensor.
std::vector<std::vector<int>> buckets_of(const std::vector<size_t>& tensor_bytes, double cap_mb, bool first_iteration) {
  std::vector<int> order;
  for (int i = static_cast<int>(tensor_bytes.size()) - 1; i >= 0; --i) order.push_back(i);
  if (first_iteration) {
    std::vector<int> all(order.rbegin(), order.rend());
    return all.empty() ? std::vector<std::vector<int>>{} : std::vector<std::vector<int>>{all};
  }
  return compute_bucket_assignment(tensor_bytes, order,
                                   {kDefaultFirstBucketBytes, static_cast<size_t>(cap_mb * 1024.0 * 1024.0)});
}

}  // namespace

StepResult simulate_step(const Topology& t, const StepModel& m, const StepConfig& c, const StepLayout& l,
                         StepCache* cache) {
  if (t.ranks() != l.size())
    throw ConfigError("layout " + layout_text(l) + " has " + std::to_string(l.size()) + " ranks; the topology " +
                      std::to_string(t.ranks()));
  if (c.compute.tflops <= 0 && (c.compute.fwd_s_per_sample <= 0 || c.compute.bwd_s_per_sample <= 0))
    throw ConfigError("a step needs its compute: --gpu-tflops (achieved TFLOP/s per GPU) or --compute-from RUN_DIR");
  if (c.global_batch < 1) throw ConfigError("--global-batch must be at least 1, got " + std::to_string(c.global_batch));
  if (c.bucket_cap_mb <= 0) throw ConfigError("--bucket-cap-mb must be > 0");
  check_schedule_name(c.schedule);
  StepResult res;
  res.layout = l;
  res.nodes = t.nodes;
  res.ranks = t.ranks();
  res.mode = l.pp > 1 ? "pipeline" : l.tp > 1 ? "tensor" : dp_sync_name(c.sync);
  if ((l.pp > 1 || l.tp > 1) && c.sync != DpSync::Ddp) res.mode += std::string("+") + dp_sync_name(c.sync);
  if (c.global_batch % l.dp != 0) {
    res.refused = "--global-batch " + std::to_string(c.global_batch) + " is not a multiple of " + std::to_string(l.dp) +
                  " data-parallel replicas";
    return res;
  }
  if (c.sync == DpSync::Fsdp && l.pp > 1) {
    res.refused = "fsdp with a pipeline is not modelled (FSDP shards a whole replica)";
    return res;
  }
  std::vector<Stage> stages;
  try {
    stages = plan_stages(m, l.pp, l.tp);
  } catch (const ConfigError& e) {
    res.refused = e.what();
    return res;
  }
  const int P = l.pp;
  res.batch_per_replica = c.global_batch / l.dp;
  int M = 1;
  if (P > 1) {
    M = c.microbatches > 0 ? c.microbatches : 4 * P;
    if (M > res.batch_per_replica) {
      res.notes.push_back("micro-batches " + std::to_string(M) + " capped at the replica's batch " +
                          std::to_string(res.batch_per_replica));
      M = static_cast<int>(res.batch_per_replica);
    }
  }
  res.microbatches = M;
  const double mb = static_cast<double>(res.batch_per_replica) / M;
  res.micro_batch = mb;

  // seconds per sample of the rank's slice of a layer
  const double model_fwd = [&] {
    double f = 0;
    for (const auto& x : m.layers) f += x.fwd_flops;
    return f;
  }();
  const double model_bwd = [&] {
    double f = 0;
    for (const auto& x : m.layers) f += x.bwd_flops;
    return f;
  }();
  auto fwd_s = [&](const RankLayer& x) {
    return c.compute.tflops > 0 ? x.fwd / (c.compute.tflops * 1e12)
                                : (model_fwd > 0 ? c.compute.fwd_s_per_sample * x.fwd / model_fwd : 0.0);
  };
  auto bwd_s = [&](const RankLayer& x) {
    return c.compute.tflops > 0 ? x.bwd / (c.compute.tflops * 1e12)
                                : (model_bwd > 0 ? c.compute.bwd_s_per_sample * x.bwd / model_bwd : 0.0);
  };

  LayoutComm comm(t, c, l, cache);
  const GridShape& g = comm.grid();
  const int N = t.ranks();
  AxisTally dp_t, pp_t, tp_t;
  for (AxisTally* a : {&dp_t, &pp_t, &tp_t}) {
    a->sent.assign(static_cast<size_t>(N), 0.0);
    a->secs = a->sent;
    a->count.assign(static_cast<size_t>(N), 0);
  }
  auto stage_ranks = [&](int s) {
    std::vector<int> v;
    for (int r = 0; r < N; ++r)
      if (g.coords(r).p == s) v.push_back(r);
    return v;
  };
  std::vector<std::vector<int>> ranks_of(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s) ranks_of[static_cast<size_t>(s)] = stage_ranks(s);
  std::vector<int> everyone(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) everyone[static_cast<size_t>(r)] = r;

  // a tp allreduce of `per_sample` bytes per sample on micro-batches of stage s, `times` per step
  auto tp_allreduce = [&](int s, double per_sample, double times) {
    if (l.tp == 1 || per_sample <= 0) return 0.0;
    const StepCache::Entry& e = comm.collective(SimCollective::Allreduce, 't', per_sample * mb);
    // every stage's tp groups are in the groups; only stage s's ranks are busy in it
    StepCache::Entry mine = e;
    for (int r = 0; r < N; ++r)
      if (g.coords(r).p != s) mine.sent[static_cast<size_t>(r)] = 0;
    tp_t.add(mine, times, ranks_of[static_cast<size_t>(s)]);
    return e.r.time_s;
  };

  // the optimizer: the run's measured seconds x the share of the parameters the rank updates
  const double total_params = static_cast<double>(std::max<int64_t>(1, m.parameters()));
  auto optimizer_s = [&](const Stage& st) {
    if (c.compute.tflops > 0) return 0.0;
    double share = static_cast<double>(st.params) / total_params;
    if (c.sync != DpSync::Ddp) share /= l.dp;
    return c.compute.optimizer_s_per_step * share;
  };

  if (c.sync == DpSync::Fsdp) {
    // ---- FSDP (pp = 1): units, all-gathers, reduce-scatters, one communication stream ----
    const Stage& st = stages[0];
    struct Unit {
      double fwd = 0, bwd = 0, bytes = 0;
    };
    std::vector<Unit> units;
    int current = -1;
    double lead_fwd = 0, lead_bwd = 0;  // layers before the first with parameters
    for (const RankLayer& x : st.layers) {
      double f = fwd_s(x) * mb, b = bwd_s(x) * mb;
      for (double a : x.tp_fwd) f += tp_allreduce(0, a, 1);
      for (double a : x.tp_bwd) b += tp_allreduce(0, a, 1);
      double pbytes = 0;
      for (int64_t e : x.tensors) pbytes += static_cast<double>(e) * m.grad_bytes;
      if (!x.tensors.empty()) {
        units.push_back({});
        current = static_cast<int>(units.size()) - 1;
        units.back().bytes = pbytes;
      }
      if (current < 0) {
        lead_fwd += f, lead_bwd += b;
      } else {
        units[static_cast<size_t>(current)].fwd += f;
        units[static_cast<size_t>(current)].bwd += b;
      }
    }
    if (!units.empty()) units[0].fwd += lead_fwd, units[0].bwd += lead_bwd;
    double compute = 0;
    for (const Unit& u : units) compute += u.fwd + u.bwd;
    if (units.empty()) compute = lead_fwd + lead_bwd;
    const int U = static_cast<int>(units.size());
    double comm_free = 0;
    auto issue = [&](double ready, SimCollective coll, double bytes) {
      if (l.dp == 1 || bytes <= 0) return ready;
      const StepCache::Entry& e = comm.collective(coll, 'd', bytes);
      dp_t.add(e, 1, everyone);
      const double start = std::max(ready, comm_free);
      comm_free = start + e.r.time_s;
      return comm_free;
    };
    double tclock = 0;
    std::vector<double> ag(static_cast<size_t>(U), 0.0);
    if (U > 0) ag[0] = issue(0, SimCollective::Allgather, units[0].bytes);
    for (int u = 0; u < U; ++u) {
      const double start = std::max(tclock, ag[static_cast<size_t>(u)]);
      if (u + 1 < U) ag[static_cast<size_t>(u + 1)] = issue(start, SimCollective::Allgather, units[static_cast<size_t>(u + 1)].bytes);
      tclock = start + units[static_cast<size_t>(u)].fwd;
    }
    std::vector<double> agb(static_cast<size_t>(U), 0.0);
    if (U > 0) agb[static_cast<size_t>(U - 1)] = issue(tclock, SimCollective::Allgather, units[static_cast<size_t>(U - 1)].bytes);
    double rs_end = 0;
    for (int u = U - 1; u >= 0; --u) {
      const double start = std::max(tclock, agb[static_cast<size_t>(u)]);
      if (u > 0) agb[static_cast<size_t>(u - 1)] = issue(start, SimCollective::Allgather, units[static_cast<size_t>(u - 1)].bytes);
      tclock = start + units[static_cast<size_t>(u)].bwd;
      rs_end = issue(tclock, SimCollective::ReduceScatter, units[static_cast<size_t>(u)].bytes);
    }
    res.compute_s = compute;
    res.optimizer_s = optimizer_s(st);
    res.step_s = std::max(tclock, rs_end) + res.optimizer_s;
    res.bubble_s = 0;
  } else {
    // ---- ddp / zero, with tensor and pipeline parallelism: the pipeline's timeline ----
    std::vector<double> f(static_cast<size_t>(P)), b(f), fc(f), bc(f), p2p_f(f), p2p_b(f);
    for (int s = 0; s < P; ++s) {
      const Stage& st = stages[static_cast<size_t>(s)];
      double tpf = 0, tpb = 0;
      for (const RankLayer& x : st.layers) {
        f[static_cast<size_t>(s)] += fwd_s(x) * mb;
        b[static_cast<size_t>(s)] += bwd_s(x) * mb;
        for (double a : x.tp_fwd) tpf += tp_allreduce(s, a, M);
        for (double a : x.tp_bwd) tpb += tp_allreduce(s, a, M);
      }
      fc[static_cast<size_t>(s)] = f[static_cast<size_t>(s)] + tpf;
      bc[static_cast<size_t>(s)] = b[static_cast<size_t>(s)] + tpb;
    }
    for (int s = 0; s + 1 < P; ++s) {
      const double bytes = stages[static_cast<size_t>(s)].send_bytes * mb;
      const StepCache::Entry& fw = comm.p2p(s, +1, bytes);
      const StepCache::Entry& bw = comm.p2p(s, -1, bytes);
      pp_t.add(fw, M, ranks_of[static_cast<size_t>(s)], false);
      pp_t.add(bw, M, ranks_of[static_cast<size_t>(s + 1)], false);
      fc[static_cast<size_t>(s)] += fw.r.time_s;
      bc[static_cast<size_t>(s + 1)] += bw.r.time_s;
      p2p_f[static_cast<size_t>(s)] = fw.r.time_s;
      p2p_b[static_cast<size_t>(s + 1)] = bw.r.time_s;
    }
    const PipeTimeline tl0 = simulate_pipeline(c.schedule, P, M, f, b);
    const PipeTimeline tl = simulate_pipeline(c.schedule, P, M, fc, bc);
    double busiest = 0;
    for (int s = 0; s < P; ++s) busiest = std::max(busiest, M * (f[static_cast<size_t>(s)] + b[static_cast<size_t>(s)]));
    res.compute_s = busiest;
    res.bubble_s = std::max(0.0, tl0.makespan - busiest);
    // the buffers' broadcast before the forward (DDP's broadcast_buffers; dtlab's models on dp only)
    double start = 0;
    if (l.dp > 1 && P == 1 && l.tp == 1 && m.buffer_bytes > 0 && c.broadcast_buffers) {
      const StepCache::Entry& e = comm.collective(SimCollective::Broadcast, 'd', m.buffer_bytes);
      dp_t.add(e, 1, everyone);
      start = e.r.time_s;
      res.broadcast_s = start;
    }
    double step = 0, opt_max = 0;
    for (int s = 0; s < P; ++s) {
      const Stage& st = stages[static_cast<size_t>(s)];
      double end = 0, b0 = 0, b1 = 0;
      for (const PipeBlock& blk : tl.blocks) {
        if (blk.stage != s) continue;
        end = std::max(end, blk.end);
        if (blk.op == PipeOp::Backward && blk.end >= b1) b0 = blk.start, b1 = blk.end;
      }
      double comm_end = 0, after = 0;
      if (l.dp > 1) {
        // the stage's tensors, registration order, and when each layer's backward is done
        std::vector<size_t> tbytes;
        std::vector<size_t> layer_of;
        for (size_t i = 0; i < st.layers.size(); ++i)
          for (int64_t e : st.layers[i].tensors) {
            tbytes.push_back(static_cast<size_t>(static_cast<double>(e) * m.grad_bytes));
            layer_of.push_back(i);
          }
        std::vector<double> done(st.layers.size(), b1);
        double tclock = b0;
        for (size_t i = st.layers.size(); i-- > 0;) {
          tclock += bwd_s(st.layers[i]) * mb;
          for (double a : st.layers[i].tp_bwd) tclock += (l.tp > 1 && a > 0) ? comm.collective(SimCollective::Allreduce, 't', a * mb).r.time_s : 0;
          done[i] = tclock;
        }
        const auto buckets = buckets_of(tbytes, c.bucket_cap_mb, c.first_iteration);
        const SimCollective coll = c.sync == DpSync::Zero ? SimCollective::ReduceScatter : SimCollective::Allreduce;
        double free = 0;
        for (const auto& bucket : buckets) {
          double bytes = 0, ready = 0;
          for (int i : bucket) {
            bytes += static_cast<double>(tbytes[static_cast<size_t>(i)]);
            ready = std::max(ready, done[layer_of[static_cast<size_t>(i)]]);
          }
          if (!c.overlap || c.first_iteration) ready = b1;
          const StepCache::Entry& e = comm.collective(coll, 'd', bytes, P > 1 ? s : -1);
          dp_t.add(e, 1, ranks_of[static_cast<size_t>(s)]);
          const double st0 = std::max(ready, free);
          free = st0 + e.r.time_s;
        }
        comm_end = free;
        if (c.sync == DpSync::Zero)
          for (const auto& bucket : buckets) {
            double bytes = 0;
            for (int i : bucket) bytes += static_cast<double>(tbytes[static_cast<size_t>(i)]);
            const StepCache::Entry& e = comm.collective(SimCollective::Allgather, 'd', bytes, P > 1 ? s : -1);
            dp_t.add(e, 1, ranks_of[static_cast<size_t>(s)]);
            after += e.r.time_s;
          }
      }
      const double opt = optimizer_s(st);
      opt_max = std::max(opt_max, opt);
      step = std::max(step, std::max(end, comm_end) + opt + after);
    }
    res.optimizer_s = opt_max;
    res.step_s = start + step;
  }
  res.exposed_s = std::max(0.0, res.step_s - res.compute_s - res.bubble_s - res.optimizer_s);
  res.samples_per_s = res.step_s > 0 ? static_cast<double>(c.global_batch) / res.step_s : 0;
  res.dp = dp_t.result();
  res.pp = pp_t.result();
  res.tp = tp_t.result();
  res.sent_per_rank.assign(static_cast<size_t>(N), 0.0);
  for (int r = 0; r < N; ++r)
    res.sent_per_rank[static_cast<size_t>(r)] = dp_t.sent[static_cast<size_t>(r)] + pp_t.sent[static_cast<size_t>(r)] +
                                                 tp_t.sent[static_cast<size_t>(r)];
  return res;
}

}  // namespace lab
