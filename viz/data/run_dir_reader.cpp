// load_run_dir: a run directory (lab/run/run_dir.h) read back into RunData, so a finished run shows
// in the same panels as a live one. The run directory is the contract: this reads only what
// RunDir writes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "bn_stats.h"
#include "dataset.h"
#include "errors.h"
#include "run_data.h"
#include "settings_check.h"

namespace viz {

namespace {

std::vector<float> floats(const nlohmann::json& j, const char* key) {
  std::vector<float> v;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) return v;
  v.reserve(it->size());
  for (const auto& x : *it) v.push_back(x.is_number() ? x.get<float>() : std::numeric_limits<float>::quiet_NaN());
  return v;
}

// A float field; null (how metrics.jsonl writes a NaN, e.g. DataParallel's devices other than 0
// have no loss of their own) reads back as NaN, as the live run holds it.
float float_or_nan(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::numeric_limits<float>::quiet_NaN();
  return it->get<float>();
}

// j.value(key, fallback) for an integer field. dtlab writes these as JSON integers; a float is read
// as before when some T holds it, and is an error when none does (1e300, -1.5 for an unsigned
// field): converting it would be undefined behaviour. The callers name the file.
template <typename T>
T int_value(const nlohmann::json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end()) return j.value(key, fallback);  // (throws as value() does when j is no object)
  if (it->is_number_float()) {
    const double v = it->get<double>();
    if (!(v > static_cast<double>(std::numeric_limits<T>::min()) - 1.0 &&
          v < std::ldexp(1.0, std::numeric_limits<T>::digits)))
      throw std::out_of_range("'" + std::string(key) + "' is " + it->dump() + ", not an integer in range");
  }
  return it->get<T>();
}

lab::StepRecord step_from_json(const nlohmann::json& j) {
  lab::StepRecord r;
  r.rank = int_value(j, "rank", 0);
  r.step = int_value(j, "step", int64_t{0});
  r.epoch = int_value(j, "epoch", int64_t{0});
  r.batch = int_value(j, "batch", int64_t{0});
  r.batch_size = int_value(j, "batch_size", int64_t{0});
  r.loss = float_or_nan(j, "loss");
  r.correct = int_value(j, "correct", int64_t{0});
  r.bytes_sent = int_value(j, "bytes_sent", uint64_t{0});
  r.t = j.value("t", 0.0);
  r.staleness = int_value(j, "staleness", int64_t{-1});
  r.version = int_value(j, "version", int64_t{-1});
  if (j.contains("param_checksum") && j["param_checksum"].is_number()) r.param_checksum = j["param_checksum"].get<double>();
  if (auto bn = j.find("bn"); bn != j.end() && bn->is_array()) {
    for (const auto& b : *bn) {
      lab::BnLayerRecord l;
      l.layer = b.value("layer", std::string());
      l.count = int_value(b, "count", int64_t{0});
      l.batch_mean = floats(b, "batch_mean");
      l.batch_var = floats(b, "batch_var");
      // local_* are written only where they differ from the statistics used (SyncBN)
      l.local_mean = b.contains("local_mean") ? floats(b, "local_mean") : l.batch_mean;
      l.local_var = b.contains("local_var") ? floats(b, "local_var") : l.batch_var;
      l.running_mean = floats(b, "running_mean");
      l.running_var = floats(b, "running_var");
      l.num_batches_tracked = int_value(b, "num_batches_tracked", int64_t{0});
      r.bn.push_back(std::move(l));
    }
  }
  return r;
}

lab::EvalResult eval_result(const nlohmann::json& j) {
  lab::EvalResult e;
  e.acc = j.value("accuracy", 0.0);
  e.loss = j.value("loss", 0.0);
  return e;
}

lab::Phase phase_from_name(const std::string& n) {
  for (lab::Phase p : {lab::Phase::ReduceScatter, lab::Phase::Allgather, lab::Phase::Broadcast, lab::Phase::Gather,
                       lab::Phase::Forward, lab::Phase::Backward, lab::Phase::OptimizerStep, lab::Phase::Eval})
    if (n == lab::phase_name(p)) return p;
  return lab::Phase::None;
}

// bn: the BatchNorm statistics of bn_stats.bin by step (moved into the step records that lack them)
void read_metrics(const std::string& path, RunData& d, std::map<int64_t, std::vector<lab::StepRecord>>* bn) {
  std::ifstream f(path);
  if (!f) throw lab::IoError("cannot read " + path, "a run directory holds metrics.jsonl (dtlab run --out DIR)");
  std::string line;
  int n = 0;
  int64_t step_records = 0;
  std::vector<lab::StepRecord> batch;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw lab::IoError(path + ":" + std::to_string(n) + ": not JSON: " + e.what());
    }
    try {
      const std::string kind = j.value("kind", std::string());
      if (kind == "step") {
        batch.push_back(step_from_json(j));
        lab::StepRecord& r = batch.back();
        if (bn && r.bn.empty())
          if (auto it = bn->find(r.step); it != bn->end() && r.rank >= 0 && r.rank < static_cast<int>(it->second.size()))
            r.bn = std::move(it->second[static_cast<size_t>(r.rank)].bn);
        // A rank's step s follows its own records of steps 0..s-1. A larger index is a damaged file,
        // and would make RunData hold room for every step up to it.
        if (batch.back().step > step_records)
          throw lab::IoError(path + ":" + std::to_string(n) + ": step " + std::to_string(batch.back().step) +
                             " comes after only " + std::to_string(step_records) + " step records");
        ++step_records;
        if (batch.size() >= 256) {
          d.add_steps(batch);
          batch.clear();
        }
      } else if (kind == "epoch") {
        lab::EpochRecord e;
        e.epoch = int_value(j, "epoch", int64_t{0});
        e.steps = int_value(j, "steps", int64_t{0});
        e.train_loss = j.value("train_loss", 0.0);
        e.train_acc = j.value("train_accuracy", 0.0);
        e.test_loss = j.value("test_loss", 0.0);
        e.test_acc = j.value("test_accuracy", 0.0);
        e.seconds = j.value("seconds", 0.0);
        e.samples_per_s = j.value("samples_per_s", 0.0);
        d.epochs.push_back(e);
      } else if (kind == "eval") {
        lab::EvalPoint p;
        p.steps = int_value(j, "steps", int64_t{0});
        p.epoch = int_value(j, "epoch", int64_t{0});
        p.samples = int_value(j, "samples", int64_t{0});
        if (j.contains("eval_mode")) p.eval_mode = eval_result(j["eval_mode"]);
        if (j.contains("train_mode")) p.train_mode = eval_result(j["train_mode"]);
        if (auto pr = j.find("probe"); pr != j.end()) {
          p.probe_label = int_value(*pr, "label", -1);
          p.probe_eval = floats(*pr, "eval_mode");
          p.probe_train = floats(*pr, "train_mode");
        }
        d.evals.push_back(std::move(p));
      }
    } catch (const nlohmann::json::exception& e) {
      throw lab::IoError(path + ":" + std::to_string(n) + ": bad record: " + e.what());
    } catch (const std::out_of_range& e) {
      throw lab::IoError(path + ":" + std::to_string(n) + ": bad record: " + e.what());
    }
  }
  d.add_steps(batch);
}

void read_trace(const std::string& path, RunData& d) {
  std::ifstream f(path);
  if (!f) return;  // an interrupted run may have none
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw lab::IoError(path + ": not a Chrome trace (JSON): " + e.what());
  }
  std::vector<std::vector<lab::Event>> per_rank(static_cast<size_t>(d.world()));
  try {
    if (auto od = j.find("otherData"); od != j.end()) {
      if (d.train_size == 0) d.train_size = int_value(*od, "train_samples", int64_t{0});
      if (d.test_size == 0) d.test_size = int_value(*od, "test_samples", int64_t{0});
    }
    auto evs = j.find("traceEvents");
    if (evs == j.end() || !evs->is_array()) return;
    for (const auto& t : *evs) {
      if (t.value("ph", std::string()) != "X") continue;
      const int rank = int_value(t, "pid", 0);
      if (rank < 0 || rank >= d.world()) continue;
      const std::string cat = t.value("cat", std::string());
      const std::string name = t.value("name", std::string());
      const nlohmann::json args = t.value("args", nlohmann::json::object());
      lab::Event e;
      e.rank = rank;
      e.t_start = t.value("ts", 0.0) * 1e-6;
      e.t_end = e.t_start + t.value("dur", 0.0) * 1e-6;
      e.train_step = int_value(args, "step", int64_t{-1});
      if (cat == "compute") {
        e.kind = lab::EventKind::Compute;
        e.phase = phase_from_name(name);
        e.op = d.intern(args.value("op", name));
      } else if (cat == "collective") {
        e.kind = lab::EventKind::Collective;
        e.op_seq = int_value(args, "op_seq", uint64_t{0});
        e.bytes = int_value(args, "bytes", uint64_t{0});
        if (args.contains("op")) {
          e.op = d.intern(args.value("op", std::string()));
          e.what = d.intern(args.value("what", std::string()));
          e.tag = int_value(args, "tag", -1);
        } else {
          // older files: "allreduce grad bucket 0"
          const size_t sp = name.find(' ');
          e.op = d.intern(name.substr(0, sp));
          std::string rest = sp == std::string::npos ? "" : name.substr(sp + 1);
          const size_t last = rest.rfind(' ');
          if (last != std::string::npos && rest.find_first_not_of("0123456789", last + 1) == std::string::npos) {
            e.tag = std::stoi(rest.substr(last + 1));
            rest = rest.substr(0, last);
          }
          e.what = d.intern(rest);
        }
      } else if (cat == "chunk") {
        e.kind = lab::EventKind::Chunk;
        e.op = d.intern(args.value("op", std::string()));
        e.what = d.intern(args.value("what", std::string()));
        e.tag = int_value(args, "tag", -1);
        e.op_seq = int_value(args, "op_seq", uint64_t{0});
        e.ring_step = int_value(args, "ring_step", -1);
        e.src = int_value(args, "src", -1);
        e.dst = int_value(args, "dst", -1);
        e.chunk = int_value(args, "chunk", -1);
        e.bytes = int_value(args, "bytes", uint64_t{0});
        e.phase = phase_from_name(args.value("phase", name.substr(0, name.find(" chunk"))));
      } else {
        continue;
      }
      per_rank[static_cast<size_t>(rank)].push_back(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw lab::IoError(path + ": bad trace event: " + e.what());
  } catch (const std::out_of_range& e) {
    throw lab::IoError(path + ": bad trace event: " + e.what());
  }
  for (int r = 0; r < d.world(); ++r) d.add_events(r, per_rank[static_cast<size_t>(r)]);
}

void read_summary(const std::string& path, RunData& d) {
  std::ifstream f(path);
  if (!f) return;  // a failed run has none
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw lab::IoError(path + ": not JSON: " + e.what());
  }
  try {
    RunSummaryView& s = d.summary;
    s.valid = true;
    if (j.contains("test_eval_mode")) {
      s.eval_acc = j["test_eval_mode"].value("accuracy", 0.0);
      s.eval_loss = j["test_eval_mode"].value("loss", 0.0);
    }
    if (j.contains("test_train_mode")) {
      s.train_acc = j["test_train_mode"].value("accuracy", 0.0);
      s.train_loss = j["test_train_mode"].value("loss", 0.0);
    }
    if (j.contains("device") && j["device"].is_object() && j["device"].contains("name")) {
      const nlohmann::json& dev = j["device"];
      s.device_name = dev["name"].get<std::string>();
      if (dev.contains("staging"))
        s.staged_bytes = dev["staging"].value("host_to_device_bytes", uint64_t{0}) +
                         dev["staging"].value("device_to_host_bytes", uint64_t{0});
      if (dev.contains("rank0") && dev["rank0"].contains("conv_algorithms"))
        for (const nlohmann::json& a : dev["rank0"]["conv_algorithms"])
          s.conv_algorithms.push_back(a.value("pass", "") + " " + a.value("layer", "") + ": " + a.value("algo", "") +
                                      " (" + a.value("how", "") + ", " + a.value("math", "") +
                                      (a.value("deterministic", true) ? "" : ", non-deterministic") + ")");
    }
    s.steps = int_value(j, "steps", int64_t{0});
    s.samples_per_s = j.value("samples_per_s", 0.0);
    s.train_seconds = j.value("train_seconds", 0.0);
    if (j.contains("steps_per_epoch")) d.steps_per_epoch = int_value(j, "steps_per_epoch", int64_t{0});
    if (d.train_size == 0) d.train_size = int_value(j, "train_samples", int64_t{0});
    if (d.test_size == 0) d.test_size = int_value(j, "test_samples", int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    throw lab::IoError(path + ": bad summary: " + e.what());
  } catch (const std::out_of_range& e) {
    throw lab::IoError(path + ": bad summary: " + e.what());
  }
}

}  // namespace

RunData load_run_dir(const std::string& dir) {
  RunData d;
  d.source = dir;
  d.live = false;
  d.phase = RunPhase::Opened;
  const std::string cfg_path = dir + "/config.toml";
  if (!std::ifstream(cfg_path))
    throw lab::IoError("--open: " + cfg_path + " not found", "give a directory written by `dtlab run --out DIR`");
  d.cfg = lab::config_from_toml_file(cfg_path);
  d.events.resize(static_cast<size_t>(d.world()));
  d.events_dropped.assign(static_cast<size_t>(d.world()), 0);
  read_summary(dir + "/summary.json", d);
  read_trace(dir + "/trace.json", d);
  std::map<int64_t, std::vector<lab::StepRecord>> bn;
  if (std::ifstream(dir + "/bn_stats.bin")) {
    lab::BnStatsFile f = lab::read_bn_stats(dir + "/bn_stats.bin");
    for (auto& step : f.steps)
      if (!step.empty()) bn[step.front().step] = std::move(step);
  }
  read_metrics(dir + "/metrics.jsonl", d, &bn);
  if (d.train_size == 0) d.train_size = train_samples(d.cfg, kFashionTrainSize);
  if (d.steps_per_epoch == 0 && !d.by_step.empty()) {
    // the largest batch index seen + 1 (a run that finished its first epoch shows every batch)
    for (const auto& row : d.by_step)
      for (const auto& r : row)
        if (r.rank >= 0) d.steps_per_epoch = std::max(d.steps_per_epoch, r.batch + 1);
  }
  // An epoch record without "steps" (0 here) still ended somewhere: after the last iteration that
  // rank 0 recorded in that epoch. Its evaluation is drawn there, not at iteration 0.
  for (lab::EpochRecord& e : d.epochs) {
    if (e.steps > 0) continue;
    for (int64_t s = d.steps_done() - 1; s >= 0; --s)
      if (const lab::StepRecord* r = d.record(s, 0); r && r->epoch == e.epoch) {
        e.steps = s + 1;
        break;
      }
  }
  d.steps_total = d.steps_done();
  d.samples_per_s = d.summary.samples_per_s;
  // The probe image (test sample 0), when the dataset is installed where the run found it.
  try {
    const lab::Dataset test = lab::load_fashion_mnist(d.cfg.data_dir.empty() ? lab::kDefaultDataDir : d.cfg.data_dir,
                                                      false, 1);
    if (test.raw.size() >= 784) d.probe_pixels.assign(test.raw.begin(), test.raw.begin() + 784);
  } catch (const lab::Error&) {
  }
  return d;
}

}  // namespace viz
