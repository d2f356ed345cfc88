#include "run_dir.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>

#include "bn_stats.h"
#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "run.h"

namespace lab {

namespace fs = std::filesystem;

RunDir::RunDir(const std::string& path, const RunDirSizes* keep) : m_path(path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw IoError("--out: cannot create run directory " + path + ": " + ec.message());
  if (!fs::is_directory(path)) throw IoError("--out: " + path + " exists and is not a directory");
  const std::string probe = file(".write-test");
  {
    std::ofstream f(probe);
    if (!f) throw IoError("--out: run directory " + path + " is not writable: " + std::strerror(errno));
  }
  fs::remove(probe, ec);
  if (keep) {
    m_keep = *keep;
    const std::string m = file("metrics.jsonl");
    const uint64_t have = fs::file_size(m, ec);
    if (ec || have < keep->metrics)
      throw IoError(m + " has " + (ec ? std::string("no") : std::to_string(have)) + " bytes, the checkpoint expects " +
                    std::to_string(keep->metrics) + " (the file was cut or replaced after the checkpoint)");
    fs::resize_file(m, keep->metrics, ec);
    if (ec) throw IoError("cannot cut " + m + " to the checkpoint's " + std::to_string(keep->metrics) + " bytes: " + ec.message());
    m_metrics.open(m, std::ios::app);
  } else {
    m_metrics.open(file("metrics.jsonl"), std::ios::trunc);
  }
  if (!m_metrics) throw IoError("cannot write " + file("metrics.jsonl") + ": " + std::strerror(errno));
}

bool is_run_dir_entry(const std::string& name) {
  static const char* const kFiles[] = {run_files::kConfig,      run_files::kMetrics,     run_files::kBnStats,
                                       run_files::kTrace,       run_files::kSummary,     run_files::kCheckpoints,
                                       run_files::kInitWeights, ".write-test"};
  for (const char* f : kFiles)
    if (name == f) return true;
  // final.safetensors, final.rank<R>.safetensors, final.rank<R>.buffers.safetensors
  const std::string ext = ".safetensors";
  return name.rfind("final.", 0) == 0 && name.size() > ext.size() &&
         name.compare(name.size() - ext.size(), ext.size(), ext) == 0;
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string fixed4(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

OutDirContents inspect_out_dir(const std::string& path) {
  OutDirContents out;
  std::error_code ec;
  if (!fs::exists(path, ec)) return out;
  if (!fs::is_directory(path, ec)) {
    out.kind = OutDirContents::Kind::Other;
    out.what = "a file, not a folder";
    return out;
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path, ec)) names.push_back(e.path().filename().string());
  if (ec) {
    out.kind = OutDirContents::Kind::Other;
    out.what = "a folder that cannot be read (" + ec.message() + ")";
    return out;
  }
  if (names.empty()) return out;
  std::sort(names.begin(), names.end());
  const auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  const bool dtlab_config = has("config.toml") && read_text(path + "/config.toml").rfind("# dtlab run configuration", 0) == 0;
  if (!dtlab_config && !has("metrics.jsonl") && !has("checkpoints")) {
    out.kind = OutDirContents::Kind::Other;
    std::string examples;
    for (size_t i = 0; i < names.size() && i < 3; ++i) examples += (i ? ", " : "") + names[i];
    out.what = std::to_string(names.size()) + (names.size() == 1 ? " file or folder" : " files or folders") +
               " that are not a run directory (" + examples + (names.size() > 3 ? ", ..." : "") + ")";
    return out;
  }
  out.kind = OutDirContents::Kind::Run;
  try {
    out.checkpoint_step = find_checkpoint(path).step;
  } catch (const std::exception&) {
  }
  // A summary.json that cannot be read (a run killed while writing it) describes nothing: the run
  // is then told apart by its checkpoints.
  std::optional<SummaryFields> summary;
  try {
    summary = read_summary_fields(path + "/" + run_files::kSummary);
  } catch (const std::exception&) {
  }
  std::string model = summary ? summary->model : "";
  if (model.empty() && dtlab_config) {
    try {
      model = config_from_toml_file(path + "/config.toml").model;
    } catch (const std::exception&) {
    }
  }
  const std::string of = model.empty() ? "" : " (" + model;
  if (summary && !summary->interrupted) {
    out.finished = true;
    const std::string acc = summary->eval_mode.samples > 0 ? ", test accuracy " + fixed4(summary->eval_mode.acc) : "";
    out.what = "a finished run" + (of.empty() ? " (" : of + ", ") + std::to_string(summary->steps) + " steps" + acc + ")";
  } else if (out.checkpoint_step >= 0) {
    out.what = "an interrupted run" + (of.empty() ? std::string() : of + ")") + " with checkpoints up to step " +
               std::to_string(out.checkpoint_step);
  } else {
    out.what = "a run that did not finish" + (of.empty() ? std::string() : of + ")") + ", with no checkpoint to continue";
  }
  return out;
}

std::string fresh_dir_name(const std::string& base) {
  if (inspect_out_dir(base).kind == OutDirContents::Kind::Empty) return base;
  for (int n = 2;; ++n) {
    const std::string d = base + "-" + std::to_string(n);
    if (inspect_out_dir(d).kind == OutDirContents::Kind::Empty) return d;
  }
}

void prepare_out_dir(const std::string& path, bool overwrite, const std::string& flag) {
  const OutDirContents c = inspect_out_dir(path);
  if (c.kind == OutDirContents::Kind::Empty) return;
  if (c.kind == OutDirContents::Kind::Other)
    throw IoError(flag + " " + path + " is not a run directory and not empty: it holds " + c.what,
                  "choose a new or empty folder for " + flag + " (dtlab writes a run only there, or replaces an "
                  "earlier run of its own with --overwrite; it never deletes files it did not write)");
  if (!overwrite) {
    std::string hint = c.checkpoint_step >= 0
                           ? "continue it with `dtlab run --resume " + path + "`, choose a new " + flag +
                                 ", or pass --overwrite to start it again"
                           : "choose a new " + flag + ", or pass --overwrite to replace it";
    throw IoError(flag + " " + path + " already holds " + c.what + ": dtlab does not replace a run unasked", hint);
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_run_dir_entry(name)) continue;  // the user's own files stay
    fs::remove_all(e.path(), ec);
    if (ec) throw IoError("--overwrite: cannot remove " + e.path().string() + ": " + ec.message());
  }
  if (ec) throw IoError("--overwrite: cannot read " + path + ": " + ec.message());
}

void RunDir::write_text(const std::string& name, const std::string& text) {
  std::ofstream f(file(name), std::ios::trunc);
  f << text;
  f.close();
  if (!f) throw IoError("cannot write " + file(name) + ": " + std::strerror(errno));
}

void RunDir::write_json(const std::string& name, const nlohmann::json& j) { write_text(name, j.dump(2) + "\n"); }

void RunDir::set_bn_stats(int world_size, const std::string& policy) {
  m_bn_policy = policy;
  m_bn_world = world_size;
  if (policy != "off") m_bn = std::make_unique<BnStatsWriter>(file("bn_stats.bin"), world_size, m_keep.bn_stats);
}

RunDirSizes RunDir::sync_sizes() {
  flush_bn();
  m_metrics.flush();
  if (!m_metrics) throw IoError("cannot write " + file("metrics.jsonl"));
  RunDirSizes s;
  std::error_code ec;
  s.metrics = fs::file_size(file("metrics.jsonl"), ec);
  if (ec) throw IoError("cannot read the size of " + file("metrics.jsonl") + ": " + ec.message());
  if (m_bn) {
    m_bn->flush();
    s.bn_stats = fs::file_size(m_bn->path(), ec);
    if (ec) throw IoError("cannot read the size of " + m_bn->path() + ": " + ec.message());
  }
  return s;
}

RunDir::~RunDir() {
  try {
    flush_bn();
  } catch (const std::exception&) {
  }
}

// The step whose records are being collected goes to bn_stats.bin when its records are complete
// (a record of a later step arrives, or the run ends).
void RunDir::flush_bn() {
  if (!m_bn || m_bn_pending.empty()) return;
  std::vector<const StepRecord*> by_rank(static_cast<size_t>(m_bn_world), nullptr);
  for (const StepRecord& r : m_bn_pending)
    if (r.rank >= 0 && r.rank < m_bn_world) by_rank[static_cast<size_t>(r.rank)] = &r;
  m_bn->append(by_rank);
  m_bn_pending.clear();
}

void RunDir::append_steps(const std::vector<StepRecord>& records) {
  for (const StepRecord& r : records) {
    // metrics.jsonl keeps the scalars; the BatchNorm arrays go to bn_stats.bin (bn_stats.h)
    m_metrics << step_record_line(r, !m_bn && m_bn_policy != "off", m_record_memory) << '\n';
    if (!m_bn) continue;
    if (!m_bn_pending.empty() && m_bn_pending.front().step != r.step) flush_bn();
    if (bn_recorded(m_bn_policy, r.step, r.epoch)) {
      m_bn_pending.push_back(r);
      m_bn_pending.back().chunks.clear();
    }
  }
  m_metrics.flush();
  if (!m_metrics) throw IoError("cannot write " + file("metrics.jsonl"));
}

void RunDir::append_epoch(const EpochRecord& e) {
  m_metrics << epoch_record_json(e).dump() << '\n';
  m_metrics.flush();
}

void RunDir::append_eval(const EvalPoint& p) {
  m_metrics << eval_point_json(p).dump() << '\n';
  m_metrics.flush();
}

void RunDir::write_trace(const std::vector<std::vector<Event>>& events_per_rank, int64_t max_step,
                         const nlohmann::json& metadata) {
  lab::write_trace(file(run_files::kTrace), events_per_rank, max_step, metadata);
}

void RunDir::write_weights(const std::string& name, const std::vector<SafeTensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  write_safetensors(file(name), tensors, metadata);
}

}  // namespace lab
