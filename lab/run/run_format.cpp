#include "run_format.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>

#include "errors.h"

namespace lab {

// ---- metrics.jsonl: writing ----

namespace {

// Shortest text that reads back as the same float (metrics hold float32 values; printing them
// as doubles would triple the file's size).
void put_float(std::string& out, float v) {
  if (!std::isfinite(v)) {
    out += "null";  // JSON has no NaN/Inf
    return;
  }
  if (v == 0.0f && std::signbit(v)) {
    out += "-0.0";  // "-0" would read back as the integer 0, losing the sign
    return;
  }
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

void put_floats(std::string& out, const char* key, const std::vector<float>& v) {
  out += ",\"";
  out += key;
  out += "\":[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    put_float(out, v[i]);
  }
  out += ']';
}

}  // namespace

std::string step_record_line(const StepRecord& r, bool with_bn, bool with_memory) {
  std::string o;
  o.reserve(256 + (with_bn ? r.bn.size() * 4096 : 0));
  o += "{\"kind\":\"step\",\"rank\":" + std::to_string(r.rank) + ",\"step\":" + std::to_string(r.step) +
       ",\"epoch\":" + std::to_string(r.epoch) + ",\"batch\":" + std::to_string(r.batch) +
       ",\"batch_size\":" + std::to_string(r.batch_size) + ",\"loss\":";
  put_float(o, r.loss);
  o += ",\"correct\":" + std::to_string(r.correct) + ",\"accuracy\":";
  put_float(o, r.batch_size ? static_cast<float>(r.correct) / static_cast<float>(r.batch_size) : 0.0f);
  o += ",\"bytes_sent\":" + std::to_string(r.bytes_sent) + ",\"t\":" + nlohmann::json(r.t).dump();
  if (with_bn) o += ",\"bn\":[";
  for (size_t i = 0; with_bn && i < r.bn.size(); ++i) {
    const BnLayerRecord& b = r.bn[i];
    if (i) o += ',';
    o += "{\"layer\":" + nlohmann::json(b.layer).dump() + ",\"count\":" + std::to_string(b.count);
    put_floats(o, "batch_mean", b.batch_mean);
    put_floats(o, "batch_var", b.batch_var);
    // The rank's own statistics differ from those used only with SyncBN; omitted when equal.
    if (b.local_mean != b.batch_mean || b.local_var != b.batch_var) {
      put_floats(o, "local_mean", b.local_mean);
      put_floats(o, "local_var", b.local_var);
    }
    if (!b.running_mean.empty()) {
      put_floats(o, "running_mean", b.running_mean);
      put_floats(o, "running_var", b.running_var);
      o += ",\"num_batches_tracked\":" + std::to_string(b.num_batches_tracked);
    }
    o += '}';
  }
  if (with_bn) o += ']';
  // Parallelism modes: only when set, so DDP's lines stay as they were.
  if (!r.chunks.empty()) {
    o += ",\"chunks\":[";
    for (size_t i = 0; i < r.chunks.size(); ++i) o += (i ? "," : "") + std::to_string(r.chunks[i]);
    o += ']';
  }
  if (r.param_drift >= 0) o += ",\"param_drift\":" + nlohmann::json(r.param_drift).dump();
  if (!r.grad_sync) o += ",\"grad_sync\":false";
  if (!std::isnan(r.param_checksum)) o += ",\"param_checksum\":" + nlohmann::json(r.param_checksum).dump();
  if (r.skipped) o += ",\"skipped\":true";
  if (!r.nonfinite.empty()) o += ",\"nonfinite\":" + nlohmann::json(r.nonfinite).dump();
  if (r.staleness >= 0) o += ",\"staleness\":" + std::to_string(r.staleness) + ",\"version\":" + std::to_string(r.version);
  if (with_memory && !r.memory.empty()) o += ",\"memory\":" + memory_points_json(r.memory).dump();
  o += '}';
  return o;
}

nlohmann::json memory_points_json(const std::vector<MemorySample>& points) {
  nlohmann::json out = nlohmann::json::array();
  for (const MemorySample& s : points) {
    nlohmann::json b = nlohmann::json::array();
    for (int c = 0; c < kMemCategories; ++c) b.push_back(s.bytes[c]);
    out.push_back({{"at", s.point}, {"bytes", b}});
  }
  return out;
}

std::vector<MemorySample> memory_points_from_json(const nlohmann::json& j) {
  std::vector<MemorySample> out;
  for (const nlohmann::json& p : j) {
    MemorySample s;
    s.point = p.at("at").get<std::string>();
    const nlohmann::json& b = p.at("bytes");
    for (int c = 0; c < kMemCategories && c < static_cast<int>(b.size()); ++c)
      s.bytes[c] = b.at(static_cast<size_t>(c)).get<int64_t>();
    out.push_back(std::move(s));
  }
  return out;
}

nlohmann::json step_record_json(const StepRecord& r) { return nlohmann::json::parse(step_record_line(r, true, true)); }

nlohmann::json epoch_record_json(const EpochRecord& e) {
  return {{"kind", "epoch"},           {"epoch", e.epoch},         {"steps", e.steps},
          {"train_loss", e.train_loss}, {"train_accuracy", e.train_acc}, {"test_loss", e.test_loss},
          {"test_accuracy", e.test_acc}, {"seconds", e.seconds},   {"samples_per_s", e.samples_per_s},
          {"lr", e.lr}};
}

nlohmann::json eval_point_json(const EvalPoint& p) {
  return {{"kind", "eval"},
          {"steps", p.steps},
          {"epoch", p.epoch},
          {"samples", p.samples},
          {"eval_mode", {{"accuracy", p.eval_mode.acc}, {"loss", p.eval_mode.loss}}},
          {"train_mode", {{"accuracy", p.train_mode.acc}, {"loss", p.train_mode.loss}}},
          {"probe", {{"test_index", 0}, {"label", p.probe_label}, {"eval_mode", p.probe_eval}, {"train_mode", p.probe_train}}}};
}

// ---- metrics.jsonl: reading ----

namespace {

// An array of floats; null (a NaN or infinity written) reads back as NaN.
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

EvalResult eval_result(const nlohmann::json& j) {
  EvalResult e;
  e.acc = j.value("accuracy", 0.0);
  e.loss = j.value("loss", 0.0);
  e.samples = int_value(j, "samples", int64_t{0});
  return e;
}

std::ifstream open_or_throw(const std::string& path, const std::string& hint) {
  std::ifstream f(path);
  if (!f) throw IoError("cannot read " + path + ": " + std::strerror(errno), hint);
  return f;
}

}  // namespace

StepRecord step_record_from_json(const nlohmann::json& j) {
  StepRecord r;
  r.rank = int_value(j, "rank", 0);
  r.step = int_value(j, "step", int64_t{0});
  r.epoch = int_value(j, "epoch", int64_t{0});
  r.batch = int_value(j, "batch", int64_t{0});
  r.batch_size = int_value(j, "batch_size", int64_t{0});
  r.loss = float_or_nan(j, "loss");
  r.correct = int_value(j, "correct", int64_t{0});
  r.bytes_sent = int_value(j, "bytes_sent", uint64_t{0});
  r.t = j.value("t", 0.0);
  if (auto bn = j.find("bn"); bn != j.end() && bn->is_array()) {
    for (const auto& b : *bn) {
      BnLayerRecord l;
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
  if (auto c = j.find("chunks"); c != j.end() && c->is_array())
    for (const auto& x : *c) r.chunks.push_back(x.get<int64_t>());
  if (auto d = j.find("param_drift"); d != j.end() && d->is_number()) r.param_drift = d->get<double>();
  r.grad_sync = j.value("grad_sync", true);
  if (auto c = j.find("param_checksum"); c != j.end() && c->is_number()) r.param_checksum = c->get<double>();
  r.skipped = j.value("skipped", false);
  r.nonfinite = j.value("nonfinite", std::string());
  r.staleness = int_value(j, "staleness", int64_t{-1});
  r.version = int_value(j, "version", int64_t{-1});
  if (auto m = j.find("memory"); m != j.end() && m->is_array()) r.memory = memory_points_from_json(*m);
  return r;
}

EpochRecord epoch_record_from_json(const nlohmann::json& j) {
  EpochRecord e;
  e.epoch = int_value(j, "epoch", int64_t{0});
  e.steps = int_value(j, "steps", int64_t{0});  // 0: an older run directory's epoch line without it
  e.train_loss = j.value("train_loss", 0.0);
  e.train_acc = j.value("train_accuracy", 0.0);
  e.test_loss = j.value("test_loss", 0.0);
  e.test_acc = j.value("test_accuracy", 0.0);
  e.seconds = j.value("seconds", 0.0);
  e.samples_per_s = j.value("samples_per_s", 0.0);
  e.lr = j.value("lr", 0.0);
  return e;
}

EvalPoint eval_point_from_json(const nlohmann::json& j) {
  EvalPoint p;
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
  return p;
}

namespace {

constexpr const char* kMetricsHint = "a run directory holds metrics.jsonl (dtlab run --out DIR)";

// Calls each(json, line number) for every non-empty line of metrics.jsonl.
template <typename Each>
void for_each_metrics_line(const std::string& path, Each&& each) {
  std::ifstream f = open_or_throw(path, kMetricsHint);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw IoError(path + ":" + std::to_string(n) + ": not JSON: " + e.what());
    }
    each(j, n);
  }
}

}  // namespace

void read_metrics(const std::string& path, const MetricsReader& reader) {
  for_each_metrics_line(path, [&](const nlohmann::json& j, int n) {
    try {
      const std::string kind = j.value("kind", std::string());
      if (kind == "step") {
        if (reader.on_step) reader.on_step(step_record_from_json(j), n);
      } else if (kind == "epoch") {
        if (reader.on_epoch) reader.on_epoch(epoch_record_from_json(j));
      } else if (kind == "eval") {
        if (reader.on_eval) reader.on_eval(eval_point_from_json(j));
      }
    } catch (const nlohmann::json::exception& e) {
      throw IoError(path + ":" + std::to_string(n) + ": bad record: " + e.what());
    } catch (const std::out_of_range& e) {
      throw IoError(path + ":" + std::to_string(n) + ": bad record: " + e.what());
    }
  });
}

std::vector<nlohmann::json> read_metrics_json(const std::string& path) {
  std::vector<nlohmann::json> lines;
  for_each_metrics_line(path, [&](const nlohmann::json& j, int) { lines.push_back(j); });
  return lines;
}

// ---- trace.json ----

void write_trace(const std::string& path, const std::vector<std::vector<Event>>& events_per_rank, int64_t max_step,
                 const nlohmann::json& metadata) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) throw IoError("cannot write " + path + ": " + std::strerror(errno));
  f << "{\"displayTimeUnit\":\"ms\",\"otherData\":" << metadata.dump() << ",\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const nlohmann::json& j) {
    if (!first) f << ",\n";
    first = false;
    f << j.dump();
  };
  for (size_t r = 0; r < events_per_rank.size(); ++r) {
    emit({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    emit({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r}, {"args", {{"sort_index", r}}}});
    emit({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    emit({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 1}, {"args", {{"name", "communication"}}}});
    emit({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 2}, {"args", {{"name", "chunks"}}}});
    // a run on a device that times itself: what the device did, on a track of its own
    if (std::any_of(events_per_rank[r].begin(), events_per_rank[r].end(), [](const Event& e) { return e.kind == EventKind::Device; }))
      emit({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 3}, {"args", {{"name", "device"}}}});
    for (const Event& e : events_per_rank[r]) {
      if (max_step >= 0 && e.train_step >= max_step) continue;
      nlohmann::json j;
      j["ph"] = "X";
      j["pid"] = r;
      j["ts"] = e.t_start * 1e6;
      j["dur"] = (e.t_end - e.t_start) * 1e6;
      nlohmann::json args = {{"step", e.train_step}};
      if (e.kind == EventKind::Compute) {
        j["tid"] = 0;
        j["name"] = phase_name(e.phase);
        j["cat"] = "compute";
        if (std::strcmp(e.op, phase_name(e.phase)) != 0) args["op"] = e.op;
        if (e.tag >= 0) args["tag"] = e.tag;  // a pipeline's micro-batch
      } else if (e.kind == EventKind::Device) {
        j["tid"] = 3;
        j["name"] = std::string(e.op) + (e.tag >= 0 ? " " + std::to_string(e.tag) : "");
        j["cat"] = "device";
        args["op"] = e.op;
        args["what"] = e.what;
        args["tag"] = e.tag;
        args["phase"] = phase_name(e.phase);
        if (e.bytes) args["bytes"] = e.bytes;
      } else if (e.kind == EventKind::Collective) {
        j["tid"] = 1;
        j["name"] = std::string(e.op) + " " + e.what + (e.tag >= 0 ? " " + std::to_string(e.tag) : "");
        j["cat"] = "collective";
        args["op"] = e.op;
        args["what"] = e.what;
        args["tag"] = e.tag;
        args["op_seq"] = e.op_seq;
        args["bytes"] = e.bytes;
        if (e.group[0]) args["group"] = e.group;
      } else {
        j["tid"] = 2;
        j["name"] = std::string(phase_name(e.phase)) + " chunk " + std::to_string(e.chunk);
        j["cat"] = "chunk";
        args["op"] = e.op;
        args["what"] = e.what;
        args["tag"] = e.tag;
        args["phase"] = phase_name(e.phase);
        args["op_seq"] = e.op_seq;
        args["ring_step"] = e.ring_step;
        if (e.group[0]) args["group"] = e.group;
        args["src"] = e.src;
        args["dst"] = e.dst;
        args["chunk"] = e.chunk;
        args["bytes"] = e.bytes;
      }
      j["args"] = std::move(args);
      emit(j);
    }
  }
  f << "\n]}\n";
  f.close();
  if (!f) throw IoError("cannot write " + path);
}

namespace {

Phase phase_from_name(const std::string& n) {
  for (int i = 1; i <= static_cast<int>(Phase::kLast); ++i)
    if (n == phase_name(static_cast<Phase>(i))) return static_cast<Phase>(i);
  return Phase::None;
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream f = open_or_throw(path, "");
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw IoError(path + ": not JSON: " + e.what());
  }
}

TraceContents read_trace(const std::string& path, int world,
                         const std::function<const char*(const std::string&)>& intern) {
  std::ifstream f = open_or_throw(path, "");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw IoError(path + ": not a Chrome trace (JSON): " + e.what());
  }
  TraceContents out;
  out.per_rank.resize(static_cast<size_t>(std::max(world, 0)));
  try {
    if (auto od = j.find("otherData"); od != j.end() && od->is_object()) {
      out.other_data = *od;
      out.train_samples = int_value(*od, "train_samples", int64_t{0});
      out.test_samples = int_value(*od, "test_samples", int64_t{0});
    }
    auto evs = j.find("traceEvents");
    if (evs == j.end() || !evs->is_array()) return out;
    for (const auto& t : *evs) {
      if (t.value("ph", std::string()) != "X") continue;
      const int rank = int_value(t, "pid", 0);
      if (rank < 0 || rank >= world) continue;
      const std::string cat = t.value("cat", std::string());
      const std::string name = t.value("name", std::string());
      const nlohmann::json args = t.value("args", nlohmann::json::object());
      Event e;
      e.rank = rank;
      e.t_start = t.value("ts", 0.0) * 1e-6;
      e.t_end = e.t_start + t.value("dur", 0.0) * 1e-6;
      e.train_step = int_value(args, "step", int64_t{-1});
      if (cat == "compute") {
        e.kind = EventKind::Compute;
        e.phase = phase_from_name(name);
        e.op = intern(args.value("op", name));
        e.tag = int_value(args, "tag", -1);
      } else if (cat == "collective") {
        e.kind = EventKind::Collective;
        e.group = intern(args.value("group", std::string()));
        e.op_seq = int_value(args, "op_seq", uint64_t{0});
        e.bytes = int_value(args, "bytes", uint64_t{0});
        if (args.contains("op")) {
          e.op = intern(args.value("op", std::string()));
          e.what = intern(args.value("what", std::string()));
          e.tag = int_value(args, "tag", -1);
        } else {
          // older files: "allreduce grad bucket 0"
          const size_t sp = name.find(' ');
          e.op = intern(name.substr(0, sp));
          std::string rest = sp == std::string::npos ? "" : name.substr(sp + 1);
          const size_t last = rest.rfind(' ');
          if (last != std::string::npos && last + 1 < rest.size() &&
              rest.find_first_not_of("0123456789", last + 1) == std::string::npos) {  // (out_of_range: too long)
            e.tag = std::stoi(rest.substr(last + 1));
            rest = rest.substr(0, last);
          }
          e.what = intern(rest);
        }
      } else if (cat == "chunk") {
        e.kind = EventKind::Chunk;
        e.group = intern(args.value("group", std::string()));
        e.op = intern(args.value("op", std::string()));
        e.what = intern(args.value("what", std::string()));
        e.tag = int_value(args, "tag", -1);
        e.op_seq = int_value(args, "op_seq", uint64_t{0});
        e.ring_step = int_value(args, "ring_step", -1);
        e.src = int_value(args, "src", -1);
        e.dst = int_value(args, "dst", -1);
        e.chunk = int_value(args, "chunk", -1);
        e.bytes = int_value(args, "bytes", uint64_t{0});
        e.phase = phase_from_name(args.value("phase", name.substr(0, name.find(" chunk"))));
      } else if (cat == "device") {
        e.kind = EventKind::Device;
        e.op = intern(args.value("op", name));
        e.what = intern(args.value("what", std::string()));
        e.tag = int_value(args, "tag", -1);
        e.bytes = int_value(args, "bytes", uint64_t{0});
        e.phase = phase_from_name(args.value("phase", std::string()));
      } else {
        continue;
      }
      out.per_rank[static_cast<size_t>(rank)].push_back(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw IoError(path + ": bad trace event: " + e.what());
  } catch (const std::out_of_range& e) {
    throw IoError(path + ": bad trace event: " + e.what());
  }
  return out;
}

// ---- summary.json ----

SummaryFields read_summary_fields(const std::string& path) { return summary_fields(read_json_file(path), path); }

SummaryFields summary_fields(const nlohmann::json& j, const std::string& path) {
  SummaryFields s;
  if (!j.is_object()) throw IoError(path + ": bad summary: not a JSON object");
  try {
    const int version = int_value(j, "format_version", kRunDirFormatVersion);
    if (version > kRunDirFormatVersion)
      throw IoError(path + ": format_version " + std::to_string(version) + " is a newer run directory format than " +
                        std::to_string(kRunDirFormatVersion) + ", the one this dtlab reads",
                    "open it with the dtlab that wrote it (" + j.value("producer", std::string("its producer")) + ")");
    if (auto m = j.find("model"); m != j.end() && m->is_object()) {
      s.model = m->value("name", std::string());
      s.parameters = int_value(*m, "parameters", int64_t{0});
    }
    if (auto m = j.find("memory"); m != j.end() && m->is_object() && m->contains("per_rank"))
      for (const nlohmann::json& r : m->at("per_rank")) {
        s.memory_peak_step.push_back(int_value(r.at("peak"), "step", int64_t{-1}));
        s.memory_peak_points.push_back(memory_points_from_json(r.at("peak_step_points")));
      }
    s.interrupted = j.contains("interrupted");
    if (j.contains("test_eval_mode")) s.eval_mode = eval_result(j["test_eval_mode"]);
    if (j.contains("test_train_mode")) s.train_mode = eval_result(j["test_train_mode"]);
    if (j.contains("device") && j["device"].is_object() && j["device"].contains("name")) {
      const nlohmann::json& dev = j["device"];
      s.device_name = dev["name"].get<std::string>();
      if (dev.contains("staging"))
        s.staged_bytes = dev["staging"].value("host_to_device_bytes", uint64_t{0}) +
                         dev["staging"].value("device_to_host_bytes", uint64_t{0});
      if (dev.contains("rank0") && dev["rank0"].contains("cuda_graphs")) {
        const nlohmann::json& g = dev["rank0"]["cuda_graphs"];
        s.cuda_graphs = std::to_string(g.value("captured", int64_t{0})) + " captured, " +
                        std::to_string(g.value("replayed", int64_t{0})) + " replayed, " +
                        std::to_string(g.value("eager", int64_t{0})) + " eager";
      }
      if (dev.contains("rank0") && dev["rank0"].contains("conv_algorithms"))
        for (const nlohmann::json& a : dev["rank0"]["conv_algorithms"])
          s.conv_algorithms.push_back(a.value("pass", "") + " " + a.value("layer", "") + ": " + a.value("algo", "") +
                                      " (" + a.value("how", "") + ", " + a.value("math", "") +
                                      (a.value("deterministic", true) ? "" : ", non-deterministic") + ")");
    }
    s.steps = int_value(j, "steps", int64_t{0});
    s.samples_per_s = j.value("samples_per_s", 0.0);
    s.train_seconds = j.value("train_seconds", 0.0);
    s.steps_per_epoch = int_value(j, "steps_per_epoch", int64_t{0});
    s.train_samples = int_value(j, "train_samples", int64_t{0});
    s.test_samples = int_value(j, "test_samples", int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    throw IoError(path + ": bad summary: " + e.what());
  } catch (const std::out_of_range& e) {
    throw IoError(path + ": bad summary: " + e.what());
  }
  return s;
}

}  // namespace lab
