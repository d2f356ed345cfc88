// The end of a run (Run::finish's parts): the run's figures from every rank's counters and events,
// rank 0's final evaluation in both BatchNorm modes, and the outputs: the final weights and
// summary.json (the mode adds its own section, mode.h).
//   summarize()        steps, samples, training seconds (every process)
//   final_evaluation() rank 0's model in eval and train mode; ranks whose buffers differ
//   communication()    skipped steps, traffic, overlap, compute seconds, local SGD's drift
//   write_outputs()    summary.json's document (summary_fields() reads it); with a run directory,
//                      final.safetensors (and per-rank files) and summary.json
#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "mode.h"
#include "parallel.h"
#include "run.h"
#include "run_dir.h"
#include "run_format.h"
#include "run_internal.h"
#include "sampler.h"

namespace lab {

namespace {

// Ranks whose state (buffers, or parameters) differs from rank 0's.
std::vector<int> ranks_differing(std::vector<std::unique_ptr<Model>>& replicas, int world, bool buffers_only) {
  const auto t0 = model_tensors(*replicas[0], buffers_only);
  std::vector<int> out;
  for (int r = 1; r < world; ++r) {
    const auto tr = model_tensors(*replicas[static_cast<size_t>(r)], buffers_only);
    bool same = tr.size() == t0.size();
    for (size_t i = 0; same && i < tr.size(); ++i) same = tr[i].bytes == t0[i].bytes;
    if (!same) out.push_back(r);
  }
  return out;
}

}  // namespace

// Training throughput: samples trained / wall time of the rank threads (evaluation excluded by
// subtracting rank 0's eval events).
void Run::summarize(const std::vector<std::vector<Event>>& events, double t_end) {
  double eval_time = 0;
  for (const Event& e : events[static_cast<size_t>(m_local.front())])
    if (e.kind == EventKind::Compute && e.phase == Phase::Eval) eval_time += e.t_end - e.t_start;
  int64_t max_step = -1;
  for (auto& rs : m_ranks)
    if (rs->latest) max_step = std::max(max_step, rs->latest->step);
  const int64_t steps = std::max(max_step + 1, m_start_step_resumed);
  // Samples actually trained: sum of every rank's batch sizes over the run.
  int64_t samples = 0;
  if (mode_of(m_cfg).caps().counts_trained_samples || m_cfg.uneven_data) {
    // DataParallel's global batches, the workers' pushes, or ranks with different numbers of
    // batches: as counted.
    for (auto& rs : m_ranks) samples += rs->trained_samples;
  } else {
    // DistributedSampler gives every rank the same number of samples per epoch.
    DistributedSampler probe({m_train.size, m_cfg.world_size, 0, m_cfg.shuffle, m_cfg.seed, m_cfg.sampler_drop_last});
    const auto per_rank_batches = make_batches(probe.indices(), m_cfg.batch_size, m_cfg.drop_last);
    for (int64_t s = 0; s < steps; ++s)
      samples += static_cast<int64_t>(per_rank_batches[static_cast<size_t>(s % m_steps_per_epoch)].size()) *
                 m_cfg.world_size;
  }
  m_summary.steps = steps;
  m_summary.samples = samples;
  m_summary.epochs = m_epochs;
  m_summary.epochs_completed = static_cast<int64_t>(m_epochs.size());
  if (m_resume) eval_time += m_resume->eval_seconds;
  m_summary.train_seconds = std::max(1e-9, (t_end - m_t0) - eval_time);
  m_summary.samples_per_s = static_cast<double>(samples) / m_summary.train_seconds;
}

// Final evaluation of rank 0's model (as PyTorch users do: model.eval() on rank 0). Evaluation in
// train mode runs on a copy, so the saved running statistics are untouched. Returns the ranks
// whose buffers differ from rank 0's (no broadcast_buffers, or a run that stopped mid-epoch).
std::vector<int> Run::final_evaluation() {
  set_compute_threads(m_cfg.threads > 0 ? m_cfg.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  Model& m0 = *m_replicas[0];
  m_summary.eval_mode = evaluate(m0, Mode::Eval, m_cfg.eval_batch_size, 0, m_test.size);
  auto copy = build_model(model_options(m_cfg), m_cfg.seed);
  attach_device(*copy, 0);
  copy_state(m0, *copy);
  m_summary.train_mode = evaluate(*copy, Mode::Train, m_cfg.batch_size, 0, m_test.size);
  // (DataParallel's devices other than 0 hold last iteration's replicas, not models of their own.)
  const std::vector<int> differing = mode_of(m_cfg).caps().replicas_are_models
                                         ? ranks_differing(m_replicas, m_cfg.world_size, true)
                                         : std::vector<int>{};
  if (!differing.empty()) {
    m_summary.eval_mode_per_rank.push_back(m_summary.eval_mode);
    for (int r = 1; r < m_cfg.world_size; ++r)
      m_summary.eval_mode_per_rank.push_back(
          evaluate(*m_replicas[static_cast<size_t>(r)], Mode::Eval, m_cfg.eval_batch_size, 0, m_test.size));
  }
  return differing;
}

// Communication figures, skipped steps and local SGD's drift (comm_stats.h, local_sgd.h).
ComputeStats Run::communication(const std::vector<std::vector<Event>>& events) {
  for (auto& rs : m_ranks) {
    std::lock_guard<std::mutex> lock(rs->mu);
    for (int64_t st : rs->skipped)
      if (std::find(m_summary.skipped_steps.begin(), m_summary.skipped_steps.end(), st) == m_summary.skipped_steps.end())
        m_summary.skipped_steps.push_back(st);
  }
  std::sort(m_summary.skipped_steps.begin(), m_summary.skipped_steps.end());
  m_summary.traffic = traffic_stats(events);
  m_summary.overlap = overlap_stats(events);
  ComputeStats cs = compute_stats(events);
  add_resumed_stats(m_summary, cs);  // --resume: the iterations before the checkpoint
  std::map<int64_t, double> max_drift;  // step -> max over ranks
  for (auto& rs : m_ranks)
    for (const auto& [st, d] : rs->drifts) max_drift[st] = std::max(max_drift[st], d);
  m_summary.drift.assign(max_drift.begin(), max_drift.end());
  m_summary.drift_max = m_summary.drift_mean = 0;
  for (const auto& [st, d] : m_summary.drift) {
    m_summary.drift_max = std::max(m_summary.drift_max, d);
    m_summary.drift_mean += d / static_cast<double>(m_summary.drift.size());
  }
  if (mode_of(m_cfg).caps().parameter_server) {
    std::lock_guard<std::mutex> lock(m_async_mu);
    m_summary.async_updates = m_async_updates;
  }
  return cs;
}

void Run::write_outputs(const std::vector<std::vector<Event>>& events, const std::vector<int>& differing,
                        const ComputeStats& cs) {
  SummaryEnv env{m_cfg, m_summary, events, {}};
  // Ranks whose parameters differ from rank 0's (local SGD between averagings): their own files.
  if (mode_of(m_cfg).caps().own_parameters)
    env.ranks_with_own_parameters = ranks_differing(m_replicas, m_cfg.world_size, false);
  m_summary_doc = std::make_unique<nlohmann::json>(summary_json(differing, cs));
  mode_of(m_cfg).summary(env, *m_summary_doc);
  if (!m_dir) return;
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"producer", std::string("dtlab ") + kDtlabVersion}, {"rank", "0"}};
  m_dir->write_weights("final.safetensors", model_tensors(*m_replicas[0]), meta);
  for (int r : differing) {
    auto m = meta;
    m["rank"] = std::to_string(r);
    m_dir->write_weights("final.rank" + std::to_string(r) + ".buffers.safetensors",
                         model_tensors(*m_replicas[static_cast<size_t>(r)], true), m);
  }
  for (int r : env.ranks_with_own_parameters) {
    auto m = meta;
    m["rank"] = std::to_string(r);
    m_dir->write_weights("final.rank" + std::to_string(r) + ".safetensors", model_tensors(*m_replicas[static_cast<size_t>(r)]), m);
  }
  m_dir->write_json(run_files::kSummary, *m_summary_doc);
}

SummaryFields Run::summary_fields() const {
  if (!m_summary_doc) throw std::logic_error("Run::summary_fields before finish() in rank 0's process");
  return lab::summary_fields(*m_summary_doc, "the run's summary");
}

namespace {

// summary.json's "traffic", "communication" and "compute": what moved, how long collectives took
// and how much of it hid behind backward, and the compute phases' seconds.
void communication_json(const RunConfig& c, const RunSummary& s, const ComputeStats& cs, nlohmann::json& j) {
  const TrafficStats& tr = s.traffic;
  nlohmann::json parts = nlohmann::json::object();
  for (const TrafficStats::Part& p : tr.by_what)
    parts[p.what] = {{"bytes_moved", p.bytes_moved}, {"sent_per_rank", p.sent}, {"received_per_rank", p.received}};
  j["traffic"] = {{"bytes_moved", tr.bytes_moved}, {"sent_per_rank", tr.sent}, {"received_per_rank", tr.received},
                  {"rank0_share", tr.rank0_share}, {"by_what", parts},
                  {"what", "messages of the training steps; rank0_share = bytes sent or received by rank 0 "
                           "(DataParallel: device 0) / bytes moved; by_what: the same per kind of message "
                           "(grad bucket, buffers, bn stats, ...)"}};
  const OverlapStats& ov = s.overlap;
  nlohmann::json per_rank = nlohmann::json::array();
  for (size_t r = 0; r < ov.comm_seconds.size(); ++r)
    per_rank.push_back({{"rank", r}, {"comm_seconds", ov.comm_seconds[r]}, {"hidden_seconds", ov.hidden_seconds[r]},
                        {"hidden_fraction", ov.comm_seconds[r] > 0 ? ov.hidden_seconds[r] / ov.comm_seconds[r] : 0.0}});
  j["communication"] = {{"per_rank", per_rank}, {"comm_seconds", ov.comm_seconds_total},
                        {"hidden_seconds", ov.hidden_seconds_total}, {"hidden_fraction", ov.hidden_fraction},
                        {"overlap", c.overlap},
                        {"link", {{"latency_us", c.link_latency_us}, {"gbps", c.link_gbps}, {"gpus_per_node", c.link_gpus_per_node},
                                   {"nic_gbps", c.link_nic_gbps}, {"nic_latency_us", c.link_nic_latency_us},
                                   {"nics_per_node", c.link_nics_per_node}, {"nodes_per_leaf", c.link_nodes_per_leaf},
                                   {"oversubscription", c.link_oversubscription}}},
                        {"what", "seconds inside collectives during training steps, and the part of them "
                                 "that overlapped the same rank's backward computation"}};
  nlohmann::json cpr = nlohmann::json::array();
  double fw = 0, bw = 0, opt = 0;
  for (size_t r = 0; r < cs.forward.size(); ++r) {
    cpr.push_back({{"rank", r}, {"forward_seconds", cs.forward[r]}, {"backward_seconds", cs.backward[r]},
                   {"optimizer_seconds", cs.optimizer[r]}});
    fw += cs.forward[r] / static_cast<double>(cs.forward.size());
    bw += cs.backward[r] / static_cast<double>(cs.forward.size());
    opt += cs.optimizer[r] / static_cast<double>(cs.forward.size());
  }
  j["compute"] = {{"per_rank", cpr}, {"forward_seconds", fw}, {"backward_seconds", bw}, {"optimizer_seconds", opt},
                  {"what", "seconds of forward, backward and optimizer steps during training (mean over ranks, and "
                           "per rank); a backward includes the waits DDP's buckets make it do"}};
}

}  // namespace

// summary.json without the mode's own section (the mode adds it: mode.h's Mode::summary).
namespace {
nlohmann::json categories_json(const MemoryBytes& b) {
  nlohmann::json o = nlohmann::json::object();
  for (int c = 0; c < kMemCategories; ++c) o[memory_category_name(c)] = b[c];
  return o;
}
}  // namespace

nlohmann::json Run::memory_json(int64_t psi) {
  const ParallelMode& mode = mode_of(m_cfg);
  const OptimizerOptions opt = optimizer_options(m_cfg);
  ZeroFormula f;
  f.stage = mode.zero_stage(m_cfg);
  f.psi = psi;
  f.k = optimizer_bytes_per_parameter(!opt.is_sgd(), opt.sgd.momentum);
  f.world = m_cfg.world_size;
  nlohmann::json ranks = nlohmann::json::array();
  RunSummary::MemoryOutline& outline = m_summary.memory;
  outline = RunSummary::MemoryOutline{};
  outline.formula = f.model_states().total();
  outline.expression = f.expression();
  // A mode that splits the model: each rank's model states are (8+K) Psi_r, Psi_r the parameters it
  // holds (its stage's, its slices'); the line names the peak rank's
  const bool split = mode.rank_parameters(m_cfg, 0) >= 0;
  std::vector<int64_t> psi_r;
  if (split)
    for (int r = 0; r < m_cfg.world_size; ++r) psi_r.push_back(mode.rank_parameters(m_cfg, r));
  auto split_states = [&](int r) {
    ZeroFormula fr = f;
    fr.psi = psi_r[static_cast<size_t>(r)];
    return fr.model_states();
  };
  for (size_t r = 0; r < m_ranks.size(); ++r) {
    RankState& rs = *m_ranks[r];
    std::lock_guard<std::mutex> lock(rs.mu);
    if (rs.memory_peak.empty()) continue;
    const MemorySample& top = rs.memory_peak.top();
    if (outline.rank < 0 || top.bytes.total() > outline.peak) {
      outline.rank = static_cast<int>(r);
      outline.step = rs.memory_peak.step;
      outline.peak = top.bytes.total();
      outline.at = top.point;
      outline.states_end = rs.memory_last_points.back().bytes.model_states();
      if (split) {
        outline.formula = split_states(static_cast<int>(r)).total();
        outline.expression = "(8+K)Psi_r, Psi_r = rank " + std::to_string(r) + "'s " + std::to_string(psi_r[r]) + " parameters";
      }
    }
    ranks.push_back({{"rank", r},
                     {"peak", {{"bytes", top.bytes.total()}, {"step", rs.memory_peak.step}, {"at", top.point},
                               {"by_category", categories_json(top.bytes)}}},
                     {"end_of_step", categories_json(rs.memory_last_points.back().bytes)},
                     {"peak_step_points", memory_points_json(rs.memory_peak.points)}});
    if (split)
      ranks.back()["formula"] = {{"psi", psi_r[r]}, {"model_states", categories_json(split_states(static_cast<int>(r)))}};
  }
  nlohmann::json cats = nlohmann::json::array();
  for (int c = 0; c < kMemCategories; ++c) cats.push_back(memory_category_name(c));
  nlohmann::json formula = {{"zero_stage", f.stage}, {"expression", f.expression()}, {"psi", f.psi}, {"k", f.k},
                            {"world", f.world}, {"model_states", categories_json(f.model_states())}};
  if (split) {  // (the whole model's Psi stays: what one rank would hold without the split)
    formula["expression_per_rank"] = "(8+K)Psi_r";
    formula["psi_per_rank"] = psi_r;
  }
  return {{"per_rank", ranks},
          {"categories", cats},
          {"formula", formula},
          {"what", "bytes each rank holds, by category, as torch.cuda.memory_allocated counts them (live tensors, "
                   "not an allocator's cache): peak is the highest total at any point of any step, with the points "
                   "of that step (bytes in the order of categories); end_of_step is after the last step. formula: "
                   "the ZeRO paper's model states per rank in float32 (parameters 4 Psi, gradients 4 Psi, optimizer "
                   "K Psi: K = 0 SGD, 4 momentum, 8 Adam), divided by the world where the stage shards them; a "
                   "mode that splits the model (pipeline stages, tensor slices) has psi_per_rank, each rank's "
                   "(8+K) Psi_r in its per_rank formula"}};
}

nlohmann::json Run::summary_json(const std::vector<int>& differing, const ComputeStats& cs) {
  Model& m0 = *m_replicas[0];
  nlohmann::json j;
  j["format_version"] = kRunDirFormatVersion;
  j["producer"] = std::string("dtlab ") + kDtlabVersion;
  j["test_eval_mode"] = {{"accuracy", m_summary.eval_mode.acc}, {"loss", m_summary.eval_mode.loss},
                         {"samples", m_summary.eval_mode.samples},
                         {"what", "rank 0's final model, model.eval(): running statistics"}};
  j["test_train_mode"] = {{"accuracy", m_summary.train_mode.acc}, {"loss", m_summary.train_mode.loss},
                          {"samples", m_summary.train_mode.samples}, {"batch_size", m_cfg.batch_size},
                          {"what", "rank 0's final model, model.train(): batch statistics of test batches of "
                                   "batch_size (on a copy: the saved running statistics are unchanged)"}};
  if (!m_summary.eval_mode_per_rank.empty()) {
    nlohmann::json pr = nlohmann::json::array();
    for (const auto& e : m_summary.eval_mode_per_rank) pr.push_back({{"accuracy", e.acc}, {"loss", e.loss}});
    j["test_eval_mode_per_rank"] = pr;
    j["ranks_with_different_buffers"] = differing;
  }
  {
    int64_t params = 0, buffer_values = 0;
    for (const StateEntry& e : m0.state_dict()) {
      if (e.param) params += e.param->value.numel();
      else if (e.buffer) buffer_values += e.buffer->is_int64 ? 1 : e.buffer->value.numel();
    }
    j["model"] = {{"name", m_cfg.model}, {"parameters", params}, {"parameter_bytes", params * 4},
                  {"buffer_values", buffer_values},
                  {"what", "parameters: trainable values (the gradient every step allreduces has as many); "
                           "parameter_bytes: as float32"}};
  }
  j["device"] = device_summary();
  j["steps"] = m_summary.steps;
  j["steps_per_epoch"] = m_steps_per_epoch;
  j["train_samples"] = m_train.size;
  j["test_samples"] = m_test.size;
  j["epochs"] = m_summary.epochs_completed;
  j["samples"] = m_summary.samples;
  j["train_seconds"] = m_summary.train_seconds;
  j["samples_per_s"] = m_summary.samples_per_s;
  nlohmann::json ep = nlohmann::json::array();
  for (const EpochRecord& e : m_summary.epochs)
    ep.push_back({{"epoch", e.epoch}, {"steps", e.steps}, {"train_loss", e.train_loss},
                  {"train_accuracy", e.train_acc}, {"test_loss", e.test_loss}, {"test_accuracy", e.test_acc},
                  {"seconds", e.seconds}});
  j["per_epoch"] = ep;
  // ---- parallelism mode and communication ----
  j["mode"] = m_cfg.mode;
  communication_json(m_cfg, m_summary, cs, j);
  {
    nlohmann::json skipped = nlohmann::json::array(), sources = nlohmann::json::array();
    for (size_t r = 0; r < m_ranks.size(); ++r) {
      std::lock_guard<std::mutex> lock(m_ranks[r]->mu);
      for (int64_t st : m_ranks[r]->skipped) skipped.push_back({{"rank", r}, {"step", st}});
      for (const auto& [st, layer] : m_ranks[r]->nonfinite)
        sources.push_back({{"rank", r}, {"step", st}, {"parameter", layer}});
    }
    if (!skipped.empty() || !sources.empty())
      j["nonfinite"] = {{"on_nonfinite", m_cfg.on_nonfinite}, {"skipped", skipped}, {"sources", sources},
                        {"what", "skipped: iterations whose averaged gradient was NaN or infinite, with no optimizer "
                                 "step; sources: where a rank's own gradient was not finite before the allreduce"}};
  }
  j["memory"] = memory_json(j["model"].value("parameters", int64_t{0}));
  if (m_resume)
    j["resumed"] = {{"from_step", m_start_step_resumed}, {"checkpoint", m_resume->found.dir},
                    {"what", "this run continued from a checkpoint; its numbers are those of the whole run"}};
  if (m_interrupted_at >= 0)
    j["interrupted"] = {{"at_step", m_interrupted_at.load()},
                        {"what", "stopped early (Ctrl-C) after writing a checkpoint there: dtlab run --resume " +
                                     m_cfg.out_dir + " continues it"}};
  return j;
}

}  // namespace lab
