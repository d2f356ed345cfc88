// load_run_dir: a run directory read back into RunData, so a finished run shows in the same panels
// as a live one. Every file is read through lab/run/run_format.h, the code that writes it.
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
#include "run_format.h"
#include "settings_check.h"

namespace viz {

namespace {

// bn: the BatchNorm statistics of bn_stats.bin by step (moved into the step records that lack them)
void read_metrics(const std::string& path, RunData& d, std::map<int64_t, std::vector<lab::StepRecord>>* bn) {
  int64_t step_records = 0;
  std::vector<lab::StepRecord> batch;
  lab::MetricsReader reader;
  reader.on_step = [&](lab::StepRecord&& rec, int line) {
    batch.push_back(std::move(rec));
    lab::StepRecord& r = batch.back();
    if (bn && r.bn.empty())
      if (auto it = bn->find(r.step); it != bn->end() && r.rank >= 0 && r.rank < static_cast<int>(it->second.size()))
        r.bn = std::move(it->second[static_cast<size_t>(r.rank)].bn);
    // A rank's step s follows its own records of steps 0..s-1. A larger index is a damaged file,
    // and would make RunData hold room for every step up to it.
    if (r.step > step_records)
      throw lab::IoError(path + ":" + std::to_string(line) + ": step " + std::to_string(r.step) + " comes after only " +
                         std::to_string(step_records) + " step records");
    ++step_records;
    if (batch.size() >= 256) {
      d.add_steps(batch);
      batch.clear();
    }
  };
  reader.on_epoch = [&](lab::EpochRecord&& e) { d.epochs.push_back(e); };
  reader.on_eval = [&](lab::EvalPoint&& p) { d.evals.push_back(std::move(p)); };
  lab::read_metrics(path, reader);
  d.add_steps(batch);
}

void read_trace(const std::string& path, RunData& d) {
  if (!std::ifstream(path)) return;  // an interrupted run may have none
  lab::TraceContents t = lab::read_trace(path, d.world(), [&](const std::string& s) { return d.intern(s); });
  if (d.train_size == 0) d.train_size = t.train_samples;
  if (d.test_size == 0) d.test_size = t.test_samples;
  for (int r = 0; r < d.world(); ++r) d.add_events(r, t.per_rank[static_cast<size_t>(r)]);
}

void read_summary(const std::string& path, RunData& d) {
  if (!std::ifstream(path)) return;  // a failed run has none
  const lab::SummaryFields f = lab::read_summary_fields(path);
  static_cast<lab::SummaryFields&>(d.summary) = f;
  d.summary.valid = true;
  if (f.steps_per_epoch) d.steps_per_epoch = f.steps_per_epoch;
  if (d.train_size == 0) d.train_size = f.train_samples;
  if (d.test_size == 0) d.test_size = f.test_samples;
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
