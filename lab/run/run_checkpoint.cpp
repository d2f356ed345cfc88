// Checkpoints of a run and --resume (checkpoint.h has the files and the commit protocol).
//
// When: before iteration S, after its gate, on every rank at once (S a multiple of
// --checkpoint-every, the first iteration of an epoch with --checkpoint-every-epoch, or the stop
// that Ctrl-C chose: RunControl::request_checkpoint_stop). Every rank writes its own files, then
// tells rank 0 over the transport (not a collective: no event, no byte counted, so a run with
// checkpoints has the same metrics as one without). Rank 0 then takes the step records of its
// process not yet in metrics.jsonl (poll() waits meanwhile), the files' sizes, the epochs and
// evaluations so far, and commits.
//
// Resume: every rank loads its own parameters, buffers, momentum (and gradients being
// accumulated under no_sync), counters and DDP buckets; nobody broadcasts; the sampler, the
// DataParallel loader and the learning-rate schedule are advanced to the checkpoint's epoch; the
// run directory's files are cut back to their sizes at the checkpoint and appended to. The
// iterations after it then compute exactly what the uninterrupted run computed.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "comm_stats.h"
#include "communicator.h"
#include "errors.h"
#include "lr_schedule.h"
#include "mutation.h"
#include "optim.h"
#include "run.h"
#include "run_dir.h"
#include "run_format.h"
#include "run_internal.h"
#include "mode.h"
#include "run_wire.h"

namespace lab {

namespace fs = std::filesystem;

namespace {

Tensor from_f32(const SafeTensor& s, const std::vector<int64_t>& shape, const std::string& where) {
  if (s.dtype != "F32" || s.shape != shape)
    throw IoError(where + ": '" + s.name + "' is " + s.dtype + " of the wrong shape for this model");
  Tensor t(shape);
  std::memcpy(t.data.data(), s.bytes.data(), s.bytes.size());
  return t;
}

}  // namespace

namespace {

// The names of what the optimizer steps: the mode's (mode.h: tensor parallelism's slices,
// "tp.4.weight"), or the model's parameters' ("1.weight", of all or of some: a pipeline stage's),
// or its own parameters' (FSDP's shards: "fsdp.model").
std::vector<std::string> optimizer_param_names(const Optimizer& opt, Model& model, const RankMode& mode) {
  std::vector<std::string> named = mode.optimizer_param_names();
  if (!named.empty()) return named;
  return param_names(model, opt.params(), "");
}

// Gradients are being accumulated across iteration `step` (DDP's no_sync: the backward passes
// before a synchronized one add into .grad).
bool accumulating(const RunConfig& c, int64_t step) { return c.no_sync_steps > 0 && step % (c.no_sync_steps + 1) != 0; }

// One rank's traffic and seconds from its own events of the training steps before `step`
// (summed over ranks, these are the run's figures: each event belongs to one rank), plus what
// the iterations before a resumed run's checkpoint had (`prior`, the same form; null: none).
nlohmann::json rank_stats_json(const std::vector<Event>& mine, int rank, int world, int64_t step,
                               const nlohmann::json& prior) {
  std::vector<std::vector<Event>> per_rank(static_cast<size_t>(world));
  for (const Event& e : mine)
    if (e.train_step < step) per_rank[static_cast<size_t>(rank)].push_back(e);
  TrafficStats t = traffic_stats(per_rank);
  OverlapStats o = overlap_stats(per_rank);
  ComputeStats c = compute_stats(per_rank);
  if (!prior.is_null()) {
    t = add_traffic(traffic_from_json(prior.at("traffic")), t);
    o = add_overlap(overlap_from_json(prior.at("overlap")), o);
    c = add_compute(compute_from_json(prior.at("compute")), c);
  }
  return {{"traffic", traffic_json(t)}, {"overlap", overlap_json(o)}, {"compute", compute_json(c)}};
}

std::vector<char> encode_records(const std::vector<StepRecord>& records) {
  RankReport rep;
  rep.records = records;
  return encode_rank_report(rep);
}

void copy_run_dir(const std::string& from, const std::string& to, const std::string& checkpoint_dir) {
  std::error_code ec;
  fs::create_directories(to + "/checkpoints", ec);
  if (ec) throw IoError("--out: cannot create " + to + ": " + ec.message());
  for (const char* f : {"config.toml", "metrics.jsonl", "bn_stats.bin", "init.safetensors"}) {
    if (!fs::exists(from + "/" + f)) continue;
    fs::copy_file(from + "/" + f, to + "/" + f, fs::copy_options::overwrite_existing, ec);
    if (ec) throw IoError("--out: cannot copy " + from + "/" + f + " to " + to + ": " + ec.message());
  }
  const std::string dst = to + "/checkpoints/" + fs::path(checkpoint_dir).filename().string();
  fs::remove_all(dst, ec);
  fs::copy(checkpoint_dir, dst, fs::copy_options::recursive, ec);
  if (ec) throw IoError("--out: cannot copy " + checkpoint_dir + " to " + dst + ": " + ec.message());
}

}  // namespace

// ---- writing ----

bool Run::checkpoint_due(int64_t step, size_t batch_in_epoch) const {
  if (m_cfg.out_dir.empty()) return false;
  if (step == m_control->checkpoint_stop()) return true;
  if (step == m_start_step_resumed) return false;  // (just restored from this one)
  if (step == 0) return false;
  return (m_cfg.checkpoint_every > 0 && step % m_cfg.checkpoint_every == 0) ||
         (m_cfg.checkpoint_every_epoch && batch_in_epoch == 0);
}

// One rank's part of the checkpoint of iteration refs.step: its tensors (model, mode, optimizer,
// no_sync's accumulated gradients), its counters and its traced events.
RankCheckpoint Run::rank_checkpoint(int rank, const RankCheckpointRefs& refs, ModeCheckpoint& mode_part) {
  const RunConfig& c = m_cfg;
  const int64_t S = refs.step;
  const int world = c.world_size;
  RankState& rs = *m_ranks[static_cast<size_t>(rank)];

  RankCheckpoint rc;
  refs.mode.save(mode_part);
  rc.tensors = model_tensors(refs.model, !mode_part.model_parameters);
  rc.tensors.insert(rc.tensors.end(), mode_part.tensors.begin(), mode_part.tensors.end());
  const std::vector<std::string> names = param_names(refs.model);
  const std::vector<Param*> params = refs.model.params();
  // the optimizer's state: SGD's momentum buffers, Adam's exp_avg and exp_avg_sq (optim.<name>.<param>),
  // of the parameters this rank's optimizer owns (ZeroRedundancyOptimizer: its partition's; the state is sharded;
  // FSDP: of its shards, by their names)
  const std::vector<std::string> opt_names = optimizer_param_names(refs.opt, refs.model, refs.mode);
  for (const std::string& s : refs.opt.state_names()) {
    const std::vector<Tensor>& st = refs.opt.state(s);
    for (size_t i = 0; i < opt_names.size(); ++i)
      if (refs.opt.owns(i)) rc.tensors.push_back(f32_tensor("optim." + s + "." + opt_names[i], st[i]));
  }
  if (accumulating(c, S)) {
    refs.model.to_host(kStateGrads);  // a device's gradients (executor.h: keep_grads)
    for (size_t i = 0; i < params.size(); ++i) rc.tensors.push_back(f32_tensor("grad." + names[i], params[i]->grad));
  }
  std::vector<Event> mine;
  m_logs[static_cast<size_t>(rank)]->copy_since(0, mine);
  {
    std::lock_guard<std::mutex> lock(rs.mu);
    nlohmann::json drifts = nlohmann::json::array();
    for (const auto& [st, d] : rs.drifts) drifts.push_back({st, d});
    nlohmann::json nonfinite = nlohmann::json::array();
    for (const auto& [st, p] : rs.nonfinite) nonfinite.push_back({st, p});
    rc.counters = {{"rank", rank},
                   {"step", S},
                   {"loss_sum", rs.loss_sum},
                   {"correct", rs.correct},
                   {"samples", rs.samples},
                   {"steps", rs.steps},
                   {"trained_samples", rs.trained_samples},
                   {"drifts", drifts},
                   {"skipped", rs.skipped},
                   {"nonfinite", nonfinite},
                   {"epoch_seconds", now_seconds() - refs.t_epoch0},
                   {"lr", refs.opt.lr()},
                   {"optimizer_steps", refs.opt.steps()},
                   {"bytes_sent", refs.comm.bytes_sent()},
                   {"collectives", refs.comm.seq()},
                   {"stats", rank_stats_json(mine, rank, world, S,
                                             m_resume ? m_resume->ranks[static_cast<size_t>(rank)].counters.at("stats")
                                                      : nlohmann::json())}};
    rc.counters["model_parameters"] = mode_part.model_parameters;
    // the memory peak so far (summary.json's memory: the whole run's, not the resumed part's)
    if (!rs.memory_peak.empty())
      rc.counters["memory"] = {{"peak_step", rs.memory_peak.step},
                               {"peak_points", memory_points_json(rs.memory_peak.points)},
                               {"last_points", memory_points_json(rs.memory_last_points)}};
    rc.counters.update(mode_part.counters);
    // A rank of another process: its step records so far (rank 0's process writes its own below).
    if (!is_local(0)) rc.records = encode_records(std::vector<StepRecord>(rs.pending.begin(), rs.pending.end()));
  }
  {  // the traced events (a resumed run's from before its checkpoint first), times relative to the run's start
    RankReport ev;
    if (m_resume && static_cast<size_t>(rank) < m_resume->events.size()) ev.events = m_resume->events[static_cast<size_t>(rank)];
    for (const Event& e : mine)
      if (c.trace_steps < 0 || e.train_step < c.trace_steps) {
        ev.events.push_back(e);
        ev.events.back().t_start -= m_t0;
        ev.events.back().t_end -= m_t0;
      }
    if (!ev.events.empty()) rc.events = encode_rank_report(ev);
  }
  return rc;
}

void Run::write_checkpoint(int rank, const RankCheckpointRefs& refs) {
  const RunConfig& c = m_cfg;
  const int64_t S = refs.step;
  const int world = c.world_size;
  Transport& transport = m_world->transport(rank);
  ModeCheckpoint mode_part;  // what the mode keeps (DDP's buckets, the averager's count, ...)
  write_rank_checkpoint(c.out_dir, S, rank, rank_checkpoint(rank, refs, mode_part));
  if (rank != 0) {
    transport.send(0, &S, sizeof S, kTagCheckpoint);
    return;
  }
  for (int r = 1; r < world; ++r) {
    int64_t got = -1;
    transport.recv(r, &got, sizeof got, kTagCheckpoint);
    if (got != S)
      throw TrainingError("checkpoint: rank " + std::to_string(r) + " wrote the checkpoint of iteration " +
                          std::to_string(got) + ", rank 0 that of " + std::to_string(S));
  }
  CheckpointState st;
  {
    // This process's records before S that poll() has not written yet, and the files' sizes then.
    std::lock_guard<std::mutex> drain(m_drain_mu);
    for (int r : m_local) {
      std::vector<StepRecord> left;
      {
        RankState& o = *m_ranks[static_cast<size_t>(r)];
        std::lock_guard<std::mutex> lock(o.mu);
        for (const StepRecord& rec : o.pending)
          if (rec.step < S) left.push_back(rec);
      }
      if (!left.empty()) write_rank_records(c.out_dir, S, r, encode_records(left));
    }
    const RunDirSizes sizes = m_dir->sync_sizes();
    st.metrics_bytes = sizes.metrics;
    st.bn_stats_bytes = sizes.bn_stats;
  }
  st.step = S;
  st.epoch = refs.epoch;
  st.batch = refs.batch;
  st.require_forward_param_sync = mode_part.require_forward_param_sync;
  {
    std::lock_guard<std::mutex> lock(m_epoch_mu);
    st.epochs = m_epochs;
    st.evals = m_evals;
  }
  st.elapsed = now_seconds() - m_t0;
  std::vector<Event> mine;
  m_logs[static_cast<size_t>(rank)]->copy_since(0, mine);
  for (const Event& e : mine)
    if (e.kind == EventKind::Compute && e.phase == Phase::Eval) st.eval_seconds += e.t_end - e.t_start;
  if (m_resume) st.eval_seconds += m_resume->eval_seconds;
  st.config_toml = to_toml(c, backends());
  st.world_size = world;
  st.model = c.model;
  st.mode = c.mode;
  st.interrupted = S == m_control->checkpoint_stop();
  commit_checkpoint(c.out_dir, st);
  if (st.interrupted) m_interrupted_at = S;
}

bool Run::interrupt() {
  if (m_cfg.out_dir.empty() || !checkpointable(m_cfg)) return false;
  if (m_stop_vote) {  // several processes: the ranks agree on the iteration at their next gate
    m_stop_wanted = true;
    return true;
  }
  m_control->request_checkpoint_stop();
  return true;
}

// Rank 0 collects every rank's "was this process interrupted?" and answers with the decision:
// all ranks then checkpoint before this very iteration and stop. Two 8-byte messages per rank
// and iteration, straight over the transport (no event, no byte counted).
void Run::vote_on_stop(int rank, int64_t step) {
  Transport& t = m_world->transport(rank);
  int64_t stop = m_stop_wanted.load() ? 1 : 0;
  if (rank != 0) {
    t.send(0, &stop, sizeof stop, kTagStopVote);
    t.recv(0, &stop, sizeof stop, kTagStopDecision);
  } else {
    for (int r = 1; r < m_cfg.world_size; ++r) {
      int64_t v = 0;
      t.recv(r, &v, sizeof v, kTagStopVote);
      stop |= v;
    }
    for (int r = 1; r < m_cfg.world_size; ++r) t.send(r, &stop, sizeof stop, kTagStopDecision);
  }
  if (stop) m_control->set_checkpoint_stop(step);
}

// ---- resuming ----

void Run::load_resume() {
  auto rs = std::make_unique<ResumeState>();
  rs->found = find_checkpoint(m_cfg.resume);
  m_notes.insert(m_notes.end(), rs->found.notes.begin(), rs->found.notes.end());
  rs->state = read_checkpoint_state(rs->found.dir);
  const CheckpointState& st = rs->state;
  if (st.world_size != m_cfg.world_size)
    throw ConfigError("--resume: " + rs->found.dir + " was written by " + std::to_string(st.world_size) +
                          " ranks, this run has " + std::to_string(m_cfg.world_size),
                      "resume with the same number of ranks (--world-size " + std::to_string(st.world_size) +
                          ", or mpirun -np " + std::to_string(st.world_size) + ")");
  // The checkpoint's recorded mode and model against the run's: an identity check, not a dispatch on the mode.
  if (st.model != m_cfg.model || st.mode != m_cfg.mode)
    throw ConfigError("--resume: " + rs->found.dir + " holds a " + st.model + " trained with --mode " + st.mode +
                      ", this run is a " + m_cfg.model + " with --mode " + m_cfg.mode);
  if (st.step > m_steps_total)
    throw ConfigError("--resume: the checkpoint is at iteration " + std::to_string(st.step) + ", after this run's last (" +
                      std::to_string(m_steps_total) + ")");
  rs->ranks.resize(static_cast<size_t>(m_cfg.world_size));
  for (int r : m_local) rs->ranks[static_cast<size_t>(r)] = read_rank_checkpoint(rs->found.dir, r);
  if (m_cfg.out_dir.empty()) m_cfg.out_dir = m_cfg.resume;  // every process writes its checkpoint files there
  rs->elapsed = st.elapsed;
  rs->eval_seconds = st.eval_seconds;
  // Every rank's traced events before the checkpoint (rank 0's process writes the trace), or the
  // process's own ranks' (their next checkpoint keeps them).
  rs->events.resize(static_cast<size_t>(m_cfg.world_size));
  for (int r = 0; r < m_cfg.world_size; ++r) {
    if (!is_local(0) && !is_local(r)) continue;
    const std::string ev = rs->found.dir + "/rank" + std::to_string(r) + ".events";
    if (!fs::exists(ev)) continue;
    const RankCheckpoint part = is_local(r) ? rs->ranks[static_cast<size_t>(r)] : read_rank_checkpoint(rs->found.dir, r);
    rs->events[static_cast<size_t>(r)] =
        decode_rank_report(part.events, r, [this](const std::string& s) { return intern(s); }).events;
  }
  if (is_local(0)) {
    for (int r = 0; r < m_cfg.world_size; ++r) {
      const nlohmann::json j = read_rank_counters(rs->found.dir, r);
      try {
        const nlohmann::json& s = j.at("stats");
        rs->traffic = r == 0 ? traffic_from_json(s.at("traffic")) : add_traffic(rs->traffic, traffic_from_json(s.at("traffic")));
        rs->overlap = add_overlap(rs->overlap, overlap_from_json(s.at("overlap")));
        rs->compute = add_compute(rs->compute, compute_from_json(s.at("compute")));
      } catch (const nlohmann::json::exception& e) {
        throw IoError(rs->found.dir + "/rank" + std::to_string(r) + ".json: " + e.what());
      }
    }
    // Continue in the run directory, or in a copy of it (--out elsewhere).
    const std::string from = m_cfg.resume;
    std::error_code ec;
    if (!fs::equivalent(from, m_cfg.out_dir, ec)) {
      copy_run_dir(from, m_cfg.out_dir, rs->found.dir);
      rs->found.dir = m_cfg.out_dir + "/checkpoints/" + fs::path(rs->found.dir).filename().string();
    }
  }
  m_start_step_resumed = st.step;
  m_epochs = st.epochs;
  m_evals = st.evals;
  m_resume = std::move(rs);
}

void Run::restore_rank(int rank, RankCheckpointRefs& refs) {
  const RunConfig& c = m_cfg;
  const CheckpointState& st = m_resume->state;
  const RankCheckpoint& rc = m_resume->ranks[static_cast<size_t>(rank)];
  const std::string where = m_resume->found.dir + "/rank" + std::to_string(rank);
  // parameters and buffers (or, where the mode keeps the parameters, buffers only); momentum and
  // accumulated gradients by name; the rest is the mode's
  std::set<std::string> model_keys;
  for (const StateEntry& e : refs.model.state_dict()) model_keys.insert(e.name);
  std::vector<SafeTensor> model_part, mode_tensors;
  std::map<std::string, const SafeTensor*> extra;
  for (const SafeTensor& t : rc.tensors) {
    if (t.name.rfind("optim.", 0) == 0 || t.name.rfind("grad.", 0) == 0) extra[t.name] = &t;
    else if (model_keys.count(t.name)) model_part.push_back(t);
    else mode_tensors.push_back(t);
  }
  load_model_tensors(refs.model, model_part, where + ".safetensors", !rc.counters.value("model_parameters", true));
  const std::vector<std::string> names = param_names(refs.model);
  const std::vector<Param*> params = refs.model.params();
  const std::vector<std::string> opt_names = optimizer_param_names(refs.opt, refs.model, refs.mode);
  const std::vector<Param*>& opt_params = refs.opt.params();
  // The optimizer's state, as its steps left it. A checkpoint before any step has none.
  // (a lesson's mutation test, mutation.h: the resumed optimizer starts without its momentum)
  // (A checkpoint of an earlier dtlab counts no steps: SGD's momentum buffers say it had stepped.)
  const int64_t opt_steps = rc.counters.value(
      "optimizer_steps", int64_t{extra.count("optim.momentum." + opt_names[0]) ? 1 : 0});
  if (opt_steps > 0 && !mutated("checkpoint-drops-momentum")) {
    std::map<std::string, std::vector<Tensor>> state;
    for (const std::string& s : Optimizer::state_names_of(refs.opt.options()))
      for (size_t i = 0; i < opt_params.size(); ++i) {
        if (!refs.opt.owns(i)) {  // another rank's (ZeroRedundancyOptimizer): its checkpoint holds it
          state[s].emplace_back();
          continue;
        }
        const std::string key = "optim." + s + "." + opt_names[i];
        auto it = extra.find(key);
        if (it == extra.end())
          throw IoError(where + ".safetensors: missing '" + key + "' (the " + refs.opt.options().kind + " optimizer's state)");
        state[s].push_back(from_f32(*it->second, opt_params[i]->value.shape, where + ".safetensors"));
      }
    refs.opt.restore_state(std::move(state), opt_steps);
  }
  if (accumulating(c, st.step))
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = extra.find("grad." + names[i]);
      if (it == extra.end()) throw IoError(where + ".safetensors: missing 'grad." + names[i] + "' (no_sync's accumulated gradient)");
      params[i]->grad = from_f32(*it->second, params[i]->value.shape, where + ".safetensors");
    }
  if (accumulating(c, st.step)) refs.model.host_changed(kStateGrads);
  const nlohmann::json& j = rc.counters;
  try {
    refs.comm.restore_counters(j.at("bytes_sent").get<uint64_t>(), j.at("collectives").get<uint64_t>());
    ModeCheckpoint mode_part;  // the mode's own state (mode.h), as it was
    mode_part.counters = j;
    mode_part.tensors = std::move(mode_tensors);
    mode_part.require_forward_param_sync = st.require_forward_param_sync;
    refs.mode.restore(mode_part, st.epoch);
    for (int64_t e = 0; e < st.epoch; ++e) refs.schedule.step();  // the schedule as after st.epoch epochs
    refs.opt.set_lr(refs.schedule.lr());
    if (refs.opt.lr() != j.at("lr").get<double>())
      throw IoError(where + ".json: learning rate " + std::to_string(j.at("lr").get<double>()) +
                    " at the checkpoint, the schedule gives " + std::to_string(refs.opt.lr()));
    refs.t_epoch0 = now_seconds() - j.at("epoch_seconds").get<double>();
    RankState& rs = *m_ranks[static_cast<size_t>(rank)];
    std::lock_guard<std::mutex> lock(rs.mu);
    rs.loss_sum = j.at("loss_sum").get<double>();
    rs.correct = j.at("correct").get<int64_t>();
    rs.samples = j.at("samples").get<int64_t>();
    rs.steps = j.at("steps").get<int64_t>();
    rs.trained_samples = j.at("trained_samples").get<int64_t>();
    if (const auto m = j.find("memory"); m != j.end()) {
      rs.memory_peak = MemoryPeak{};
      rs.memory_peak.offer(m->at("peak_step").get<int64_t>(), memory_points_from_json(m->at("peak_points")));
      rs.memory_last_points = memory_points_from_json(m->at("last_points"));
      if (rs.memory_peak.empty() || rs.memory_last_points.empty())
        throw IoError(where + ".json: memory: no points at the peak or at the last iteration");
    }
    for (const auto& d : j.at("drifts")) rs.drifts.emplace_back(d.at(0).get<int64_t>(), d.at(1).get<double>());
    rs.skipped = j.at("skipped").get<std::vector<int64_t>>();
    for (const auto& d : j.at("nonfinite")) rs.nonfinite.emplace_back(d.at(0).get<int64_t>(), d.at(1).get<std::string>());
    if (!rc.records.empty()) {
      RankReport rep = decode_rank_report(rc.records, rank, [this](const std::string& s) { return intern(s); });
      for (StepRecord& r : rep.records) rs.pending.push_back(std::move(r));
    }
  } catch (const nlohmann::json::exception& e) {
    throw IoError(where + ".json: " + e.what());
  }
  refs.step = st.step;
  refs.epoch = st.epoch;
  refs.batch = st.batch;
}

void Run::add_resumed_stats(RunSummary& s, ComputeStats& compute) {
  if (!m_resume) return;
  s.traffic = add_traffic(m_resume->traffic, s.traffic);
  s.overlap = add_overlap(m_resume->overlap, s.overlap);
  compute = add_compute(m_resume->compute, compute);
}

std::vector<std::vector<Event>> Run::trace_events(const std::vector<std::vector<Event>>& events) const {
  if (!m_resume) return events;
  std::vector<std::vector<Event>> out(events.size());
  for (size_t r = 0; r < events.size(); ++r) {
    if (r < m_resume->events.size())
      for (Event e : m_resume->events[r]) {  // times relative to the run's start: onto this process's clock
        e.t_start += m_t0;
        e.t_end += m_t0;
        out[r].push_back(e);
      }
    out[r].insert(out[r].end(), events[r].begin(), events[r].end());
  }
  return out;
}

}  // namespace lab
