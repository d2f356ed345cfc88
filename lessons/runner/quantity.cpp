#include "quantity.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "bn_stats.h"
#include "command_line.h"
#include "errors.h"
#include "run_dir.h"
#include "run_format.h"
#include "safetensors.h"
#include "toml_parse.h"

namespace lessons {

// ---- outcomes ----

std::string RunOutcome::command_line() const { return commands::command_line(command, args); }

nlohmann::json RunOutcome::to_json() const {
  return {{"format", "dtlab-lesson-run-outcome"},
          {"format_version", 1},
          {"name", name},
          {"command", command},
          {"args", args},
          {"command_line", command_line()},
          {"exit_code", exit_code},
          {"error", error},
          {"hint", hint},
          {"seconds", seconds}};
}

RunOutcome RunOutcome::from_json(const nlohmann::json& j, const std::string& dir) {
  RunOutcome o;
  o.name = j.at("name").get<std::string>();
  o.command = j.at("command").get<std::string>();
  o.args = j.at("args").get<std::vector<std::string>>();
  o.exit_code = j.at("exit_code").get<int>();
  o.error = j.value("error", "");
  o.hint = j.value("hint", "");
  o.seconds = j.value("seconds", 0.0);
  o.dir = dir;
  return o;
}

void write_outcome(const RunOutcome& o) {
  std::filesystem::create_directories(o.dir);
  commands::write_result_json(o.dir + "/outcome.json", o.to_json());
}

RunOutcome read_outcome(const std::string& dir) {
  const std::string path = dir + "/outcome.json";
  std::ifstream f(path);
  if (!f) throw lab::IoError("cannot read " + path, "prepare the lesson again: dtlab lesson prepare ID");
  try {
    return RunOutcome::from_json(nlohmann::json::parse(f), dir);
  } catch (const nlohmann::json::exception& e) {
    throw lab::IoError(path + ": not a run outcome (" + e.what() + ")", "prepare the lesson again: dtlab lesson prepare ID");
  }
}

// ---- JSON values ----

namespace {

void flatten(const nlohmann::json& j, std::vector<double>& out, const std::string& where) {
  if (j.is_number()) {
    out.push_back(j.get<double>());
  } else if (j.is_array()) {
    for (const auto& e : j) flatten(e, out, where);
  } else if (j.is_boolean()) {
    out.push_back(j.get<bool>() ? 1.0 : 0.0);
  } else {
    throw QuantityError(where + ": an array that holds " + std::string(j.type_name()) + " values, not numbers" +
                        (j.is_object() ? " (reduce = \"count\" counts them; or point at one field, e.g. .../0/bytes)"
                                       : ""));
  }
}

std::string keys_of(const nlohmann::json& j) {
  std::string out;
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) out += (out.empty() ? "" : ", ") + it.key();
  else if (j.is_array())
    out = "indices 0.." + std::to_string(j.size() == 0 ? 0 : j.size() - 1);
  return out;
}

// The deepest existing prefix of a JSON pointer, to say where it went wrong.
std::string pointer_problem(const nlohmann::json& root, const std::string& ptr) {
  std::string prefix;
  const nlohmann::json* cur = &root;
  size_t pos = 1;
  while (pos <= ptr.size()) {
    const size_t next = ptr.find('/', pos);
    const std::string token = ptr.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    const nlohmann::json* child = nullptr;
    if (cur->is_object() && cur->contains(token)) child = &(*cur)[token];
    if (cur->is_array()) {
      char* end = nullptr;
      const long idx = std::strtol(token.c_str(), &end, 10);
      if (end && *end == 0 && idx >= 0 && static_cast<size_t>(idx) < cur->size()) child = &(*cur)[static_cast<size_t>(idx)];
    }
    if (!child) return "no '" + token + "' at '" + (prefix.empty() ? "/" : prefix) + "' (there: " + keys_of(*cur) + ")";
    prefix += "/" + token;
    cur = child;
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return "a bad pointer";
}

const nlohmann::json& at_pointer(const nlohmann::json& root, const std::string& ptr, const std::string& file) {
  try {
    const nlohmann::json::json_pointer p(ptr);
    if (root.contains(p)) return root.at(p);
  } catch (const nlohmann::json::exception& e) {
    throw QuantityError(file + ": bad JSON pointer '" + ptr + "': " + e.what());
  }
  throw QuantityError(file + " has no " + ptr + ": " + pointer_problem(root, ptr));
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// Why a run's file is missing: the run failed, or it never wrote that file.
std::string missing(const RunOutcome& o, const std::string& file) {
  if (o.exit_code != 0)
    return "run '" + o.name + "' ended with exit code " + std::to_string(o.exit_code) + " (" + o.error.substr(0, o.error.find('\n')) +
           ") and wrote no " + file;
  return "run '" + o.name + "' has no " + file + " in " + o.dir;
}

// Values of one step record field: "loss", "eval_mode.accuracy", or bn.<array> of a layer.
Value record_field(const nlohmann::json& rec, const QuantitySpec& q, const std::string& where) {
  if (q.path.rfind("bn.", 0) == 0) {
    std::string field = q.path.substr(3);
    if (!rec.contains("bn") || !rec["bn"].is_array()) throw QuantityError(where + ": the record has no BatchNorm statistics");
    const nlohmann::json* layer = nullptr;
    std::string layers;
    for (const auto& l : rec["bn"]) {
      layers += (layers.empty() ? "" : ", ") + l.value("layer", std::string("?"));
      if (l.value("layer", std::string()) == q.layer) layer = &l;
    }
    if (!layer) throw QuantityError(where + ": no BatchNorm layer '" + q.layer + "' (layers: " + layers + ")");
    // local_mean/local_var are recorded only where they differ from what normalized the batch
    if ((field == "local_mean" || field == "local_var") && !layer->contains(field))
      field = field == "local_mean" ? "batch_mean" : "batch_var";
    if (!layer->contains(field)) throw QuantityError(where + ": layer " + q.layer + " has no '" + field + "' (fields: " + keys_of(*layer) + ")");
    const nlohmann::json& v = (*layer)[field];
    if (q.channel) {
      if (!v.is_array()) throw QuantityError(where + ": " + field + " is not per channel");
      if (*q.channel < 0 || static_cast<size_t>(*q.channel) >= v.size())
        throw QuantityError(where + ": channel " + std::to_string(*q.channel) + " out of range (" + std::to_string(v.size()) + " channels)");
      return json_to_value(v[static_cast<size_t>(*q.channel)], where);
    }
    return json_to_value(v, where);
  }
  const nlohmann::json* cur = &rec;
  std::stringstream path(q.path);
  std::string token;
  while (std::getline(path, token, '.')) {
    if (!cur->is_object() || !cur->contains(token))
      throw QuantityError(where + ": no field '" + q.path + "' (fields: " + keys_of(*cur) + ")");
    cur = &(*cur)[token];
  }
  if (cur->is_null())
    throw QuantityError(where + ": '" + q.path + "' is null there" +
                        (q.path == "loss" ? " (DataParallel: only device 0 computes the loss; filter rank = 0)" : ""));
  return json_to_value(*cur, where);
}

// Reduces the selected records' values (numbers, or tensors of one length) elementwise.
Value reduce_values(const std::vector<Value>& vals, const std::string& how, const std::string& where) {
  if (how == "count") return Value::num(static_cast<double>(vals.size()));
  if (vals.empty()) throw QuantityError(where + ": no record matches the filters");
  if (how == "last") return vals.back();
  if (how == "first") return vals.front();
  if (how == "series") {
    std::vector<double> out;
    for (const Value& v : vals) {
      if (v.is_number()) out.push_back(v.number);
      else if (v.is_tensor()) out.insert(out.end(), v.tensor.begin(), v.tensor.end());
      else throw QuantityError(where + ": series needs numbers, got " + v.type_name());
    }
    return Value::tens(out);
  }
  const bool tensor = vals[0].is_tensor();
  const size_t n = tensor ? vals[0].tensor.size() : 1;
  std::vector<std::vector<double>> cols(n);
  for (const Value& v : vals) {
    if (tensor != v.is_tensor() || (!tensor && !v.is_number()) || (tensor && v.tensor.size() != n))
      throw QuantityError(where + ": cannot reduce " + v.type_name() + " with " + vals[0].type_name());
    for (size_t i = 0; i < n; ++i) cols[i].push_back(tensor ? v.tensor[i] : v.number);
  }
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    const std::vector<double>& c = cols[i];
    double r = 0;
    if (how == "sum" || how == "mean" || how == "std") {
      double s = 0;
      for (double x : c) s += x;
      const double mean = s / static_cast<double>(c.size());
      if (how == "sum") r = s;
      else if (how == "mean") r = mean;
      else {
        double ss = 0;
        for (double x : c) ss += (x - mean) * (x - mean);
        r = std::sqrt(ss / static_cast<double>(c.size()));
      }
    } else if (how == "min") {
      r = *std::min_element(c.begin(), c.end());
    } else if (how == "max") {
      r = *std::max_element(c.begin(), c.end());
    } else if (how == "spread") {
      r = *std::max_element(c.begin(), c.end()) - *std::min_element(c.begin(), c.end());
    } else {
      throw QuantityError(where + ": unknown reduce '" + how + "'");
    }
    out[i] = r;
  }
  return tensor ? Value::tens(out) : Value::num(out[0]);
}

std::vector<double> tensor_values(const lab::SafeTensor& t) {
  std::vector<double> out;
  if (t.dtype == "F32") {
    const size_t n = t.bytes.size() / 4;
    out.resize(n);
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, t.bytes.data() + 4 * i, 4);
      out[i] = f;
    }
  } else if (t.dtype == "I64") {
    const size_t n = t.bytes.size() / 8;
    out.resize(n);
    for (size_t i = 0; i < n; ++i) {
      int64_t v;
      std::memcpy(&v, t.bytes.data() + 8 * i, 8);
      out[i] = static_cast<double>(v);
    }
  } else {
    throw QuantityError("tensor " + t.name + " has dtype " + t.dtype + " (F32 and I64 are read)");
  }
  return out;
}

// ---- field and where: elements of an array of objects (e.g. a simulate run's /points) ----

// The element's field at a dotted path ("busbw_GBps", "nested.key"), or nullptr.
const nlohmann::json* field_of(const nlohmann::json& e, const std::string& path) {
  const nlohmann::json* cur = &e;
  std::stringstream s(path);
  std::string token;
  while (std::getline(s, token, '.')) {
    if (!cur->is_object() || !cur->contains(token)) return nullptr;
    cur = &(*cur)[token];
  }
  return cur;
}

bool term_matches(const nlohmann::json& v, const nlohmann::json& want) {
  if (want.is_string()) return v.is_string() && fnmatch(want.get<std::string>().c_str(), v.get<std::string>().c_str(), 0) == 0;
  if (want.is_boolean()) return v.is_boolean() && v.get<bool>() == want.get<bool>();
  return v.is_number() && want.is_number() && v.get<double>() == want.get<double>();
}

std::string json_text(const nlohmann::json& v) { return v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.dump(); }

std::string where_text(const QuantitySpec& q) {
  std::string out;
  for (const WhereTerm& t : q.where) {
    std::string vals;
    for (const nlohmann::json& v : t.values) vals += (vals.empty() ? "" : ", ") + json_text(v);
    out += (out.empty() ? "" : ", ") + t.key + " = " + (t.values.size() == 1 ? vals : "[" + vals + "]");
  }
  return out;
}

// The values each where key takes in the array, to say what is there when nothing matches.
std::string values_there(const nlohmann::json& arr, const QuantitySpec& q) {
  std::string out;
  for (const WhereTerm& t : q.where) {
    std::vector<std::string> seen;
    for (const nlohmann::json& e : arr) {
      const nlohmann::json* v = field_of(e, t.key);
      if (!v) continue;
      const std::string text = json_text(*v);
      if (std::find(seen.begin(), seen.end(), text) == seen.end()) seen.push_back(text);
    }
    std::string list;
    for (size_t i = 0; i < seen.size() && i < 24; ++i) list += (list.empty() ? "" : ", ") + seen[i];
    if (seen.size() > 24) list += ", ... (" + std::to_string(seen.size()) + " values)";
    out += (out.empty() ? "" : "; ") + t.key + ": " + list;
  }
  return out;
}

}  // namespace

Value RunFiles::select_elements(const nlohmann::json& arr, const QuantitySpec& q, const std::string& where) {
  if (!arr.is_array())
    throw QuantityError(where + " is " + std::string(arr.is_object() ? "an object" : std::string("a ") + arr.type_name()) +
                        ": field and where read an array of objects (e.g. result = \"/points\")");
  // a where key or the field that no element has is a misspelling, not a filter that matches nothing
  std::vector<std::string> keys = {q.field};
  for (const WhereTerm& t : q.where) keys.push_back(t.key);
  for (const std::string& k : keys) {
    if (k.empty() || arr.empty()) continue;
    bool any = false;
    for (const nlohmann::json& e : arr) any |= field_of(e, k) != nullptr;
    if (!any)
      throw QuantityError(where + ": no element has a field '" + k + "' (fields: " + keys_of(arr[0]) + ")");
  }
  std::vector<Value> vals;
  for (size_t i = 0; i < arr.size(); ++i) {
    const nlohmann::json& e = arr[i];
    bool match = true;
    for (const WhereTerm& t : q.where) {
      const nlohmann::json* v = field_of(e, t.key);
      bool any = false;
      if (v)
        for (const nlohmann::json& want : t.values) any |= term_matches(*v, want);
      match = match && any;
    }
    if (!match) continue;
    if (q.field.empty()) {  // counted only
      vals.push_back(Value::num(1));
      continue;
    }
    const nlohmann::json* f = field_of(e, q.field);
    if (!f) throw QuantityError(where + "/" + std::to_string(i) + " has no field '" + q.field + "' (fields: " + keys_of(e) + ")");
    Value v = json_to_value(*f, where + "/" + std::to_string(i) + "/" + q.field);
    // numeric reductions count a boolean as 1 or 0 (sum of "fastest": how many)
    if (v.is_bool() && q.reduce != "first" && q.reduce != "last" && !q.reduce.empty()) v = Value::num(v.boolean ? 1 : 0);
    vals.push_back(std::move(v));
  }
  const std::string selected = q.where.empty() ? "" : " where " + where_text(q);
  if (q.reduce.empty()) {
    if (vals.size() == 1) return vals[0];
    if (vals.empty())
      throw QuantityError(where + ": no element matches" + selected + " (there: " + values_there(arr, q) + ")");
    throw QuantityError(where + ": " + std::to_string(vals.size()) + " elements match" + selected +
                        ": narrow where, or add reduce (series, min, max, count, ...)");
  }
  if (vals.empty() && q.reduce != "count")
    throw QuantityError(where + ": no element matches" + selected + " (there: " + values_there(arr, q) +
                        "); reduce = \"count\" would be 0");
  return reduce_values(vals, q.reduce, where);
}

Value json_to_value(const nlohmann::json& j, const std::string& where) {
  if (j.is_number()) return Value::num(j.get<double>());
  if (j.is_boolean()) return Value::boolean_(j.get<bool>());
  if (j.is_string()) return Value::str(j.get<std::string>());
  if (j.is_array()) {
    std::vector<double> out;
    flatten(j, out, where);
    return Value::tens(out);
  }
  throw QuantityError(where + ": a " + std::string(j.type_name()) + ", not a number, boolean, string or array of numbers" +
                      (j.is_object() ? " (its keys: " + keys_of(j) + ")" : ""));
}

// ---- RunFiles ----

// Both read through lab/run/run_format.h, as the app does; its IoError (naming the file, and the
// line of metrics.jsonl) becomes the quantity's error.
const nlohmann::json& RunFiles::json_file(const std::string& path) {
  auto it = m_json.find(path);
  if (it != m_json.end()) return it->second;
  try {
    return m_json[path] = lab::read_json_file(path);
  } catch (const lab::IoError& e) {
    throw QuantityError(e.what());
  }
}

const std::vector<nlohmann::json>& RunFiles::metrics(const std::string& dir) {
  auto it = m_metrics.find(dir);
  if (it != m_metrics.end()) return it->second;
  try {
    return m_metrics[dir] = lab::read_metrics_json(dir + "/" + lab::run_files::kMetrics);
  } catch (const lab::IoError& e) {
    throw QuantityError(e.what());
  }
}

namespace {

// bn_stats.bin holds float32 values; step_record_json writes each as the shortest decimal that
// reads back as that float, which read as a double is a different double. Rounding it to float
// gives back the recorded value, so that bitwise_equal(a bn.* statistic, the same tensor from a
// weights file) holds when the bits are the same.
void round_to_recorded_floats(nlohmann::json& j) {
  if (j.is_number_float()) j = static_cast<double>(static_cast<float>(j.get<double>()));
  else if (j.is_array() || j.is_object())
    for (auto& e : j) round_to_recorded_floats(e);
}

}  // namespace

const std::map<int64_t, std::vector<nlohmann::json>>* RunFiles::bn_stats(const std::string& dir) {
  auto it = m_bn.find(dir);
  if (it != m_bn.end()) return &it->second;
  const std::string path = dir + "/" + lab::run_files::kBnStats;
  if (!is_file(path)) return nullptr;
  std::map<int64_t, std::vector<nlohmann::json>> out;
  try {
    const lab::BnStatsFile f = lab::read_bn_stats(path);
    for (const auto& step : f.steps) {
      std::vector<nlohmann::json> ranks;
      for (const lab::StepRecord& r : step) {
        ranks.push_back(lab::step_record_json(r)["bn"]);
        round_to_recorded_floats(ranks.back());
      }
      if (!step.empty()) out[step.front().step] = std::move(ranks);
    }
  } catch (const lab::Error& e) {
    throw QuantityError(e.what());
  }
  return &(m_bn[dir] = std::move(out));
}

Value RunFiles::read(const QuantitySpec& q, const RunOutcome& o) {
  const std::string where = "quantity '" + q.name + "' (run '" + o.name + "')";
  if (q.source == "exit_code") return Value::num(o.exit_code);
  if (q.source == "error") return Value::str(o.error);
  if (q.source == "summary" || q.source == "result") {
    const std::string file = q.source == "summary" ? "summary.json" : "result.json";
    const std::string path = o.dir + "/" + file;
    if (!is_file(path)) throw QuantityError(where + ": " + missing(o, file));
    const nlohmann::json& j = at_pointer(json_file(path), q.path, path);
    if (!q.field.empty() || !q.where.empty()) return select_elements(j, q, where + ": " + file + q.path);
    if (q.reduce == "count") {  // how many: array elements or object keys (e.g. /ddp/buckets)
      if (!j.is_array() && !j.is_object())
        throw QuantityError(where + ": " + file + q.path + " is a " + j.type_name() + "; reduce = \"count\" counts the "
                            "elements of an array or the keys of an object");
      return Value::num(static_cast<double>(j.size()));
    }
    return json_to_value(j, where + ": " + file + q.path);
  }
  if (q.source == "config") {
    const std::string path = o.dir + "/config.toml";
    if (!is_file(path)) throw QuantityError(where + ": " + missing(o, "config.toml"));
    toml::table t;
    try {
      t = lab::parse_toml_file(path);
    } catch (const toml::parse_error& e) {
      throw QuantityError(path + ": " + std::string(e.description()));
    }
    const toml::node_view<toml::node> n = t.at_path(q.path);
    if (!n) throw QuantityError(where + ": config.toml has no key '" + q.path + "' (write section.key, e.g. distributed.world_size)");
    if (auto v = n.value<double>(); v && (n.is_integer() || n.is_floating_point())) return Value::num(*v);
    if (auto v = n.value<bool>()) return Value::boolean_(*v);
    if (auto v = n.value<std::string>()) return Value::str(*v);
    throw QuantityError(where + ": config.toml key '" + q.path + "' is not a number, boolean or string");
  }
  if (q.source == "tensor") {
    const std::string path = o.dir + "/" + q.file;
    if (!is_file(path)) throw QuantityError(where + ": " + missing(o, q.file));
    std::vector<lab::SafeTensor> ts;
    try {
      ts = lab::read_safetensors(path);
      if (q.rank && *q.rank > 0 && q.file == "final.safetensors") {
        // the rank's own files, where it differs from rank 0 (run_dir.h)
        for (const std::string& f : {"final.rank" + std::to_string(*q.rank) + ".safetensors",
                                     "final.rank" + std::to_string(*q.rank) + ".buffers.safetensors"}) {
          if (!is_file(o.dir + "/" + f)) continue;
          for (const lab::SafeTensor& over : lab::read_safetensors(o.dir + "/" + f))
            for (lab::SafeTensor& t : ts)
              if (t.name == over.name) t = over;
        }
      }
    } catch (const lab::Error& e) {
      throw QuantityError(where + ": " + e.what());
    }
    std::vector<double> out;
    std::string names;
    int matched = 0;
    bool scalar = false;
    for (const lab::SafeTensor& t : ts) {
      names += (names.empty() ? "" : ", ") + t.name;
      if (fnmatch(q.path.c_str(), t.name.c_str(), 0) != 0) continue;
      ++matched;
      scalar = t.shape.empty();
      const std::vector<double> v = tensor_values(t);
      out.insert(out.end(), v.begin(), v.end());
    }
    if (matched == 0) throw QuantityError(where + ": no tensor in " + q.file + " matches '" + q.path + "' (tensors: " + names + ")");
    // one 0-dimensional tensor (num_batches_tracked) is a number, as in PyTorch's .item()
    if (matched == 1 && scalar && out.size() == 1) return Value::num(out[0]);
    return Value::tens(out);
  }
  if (q.source == "metrics") {
    const std::string path = o.dir + "/metrics.jsonl";
    if (!is_file(path)) throw QuantityError(where + ": " + missing(o, "metrics.jsonl"));
    const std::vector<nlohmann::json>& recs = metrics(o.dir);
    int64_t last_step = -1;
    const char* step_key = q.kind == "eval" ? "steps" : "step";  // eval records: iterations done when taken
    if (q.step && *q.step < 0)
      for (const auto& r : recs)
        if (r.value("kind", "") == q.kind && r.contains(step_key)) last_step = std::max(last_step, r[step_key].get<int64_t>());
    std::vector<Value> vals;
    for (const auto& r : recs) {
      if (r.value("kind", "") != q.kind) continue;
      if (q.rank && (!r.contains("rank") || r["rank"].get<int64_t>() != *q.rank)) continue;
      if (q.step) {
        const int64_t want = *q.step < 0 ? last_step : *q.step;
        if (!r.contains(step_key) || r[step_key].get<int64_t>() != want) continue;
      }
      if (q.epoch && (!r.contains("epoch") || r["epoch"].get<int64_t>() != *q.epoch)) continue;
      std::string at = where + ": metrics.jsonl " + q.kind + " record";
      if (r.contains("step")) at += " step " + std::to_string(r["step"].get<int64_t>());
      if (r.contains("rank")) at += " rank " + std::to_string(r["rank"].get<int64_t>());
      if (q.path.rfind("bn.", 0) == 0 && !r.contains("bn")) {
        // the statistics live in bn_stats.bin (--record-bn) for the steps it recorded
        const auto* bn = bn_stats(o.dir);
        const int64_t st = r.value("step", int64_t{-1}), rk = r.value("rank", int64_t{-1});
        const auto step = bn ? bn->find(st) : decltype(bn->end()){};
        if (!bn || step == bn->end() || rk < 0 || rk >= static_cast<int64_t>(step->second.size()))
          throw QuantityError(at + ": its BatchNorm statistics were not recorded (the run's --record-bn " +
                              std::string(bn ? "skipped this step: auto keeps every step of the first epoch, then every "
                                               "10th; use --record-bn all" : "is off, or it wrote no bn_stats.bin") + ")");
        nlohmann::json with = r;
        with["bn"] = step->second[static_cast<size_t>(rk)];
        vals.push_back(record_field(with, q, at));
        continue;
      }
      vals.push_back(record_field(r, q, at));
    }
    if (q.reduce.empty()) {
      if (vals.size() == 1) return vals[0];
      if (vals.empty()) throw QuantityError(where + ": no " + q.kind + " record of metrics.jsonl matches the filters");
      throw QuantityError(where + ": " + std::to_string(vals.size()) + " " + q.kind +
                          " records match: filter by rank, step or epoch, or add reduce (last, mean, spread, series, ...)");
    }
    return reduce_values(vals, q.reduce, where);
  }
  if (q.source == "trace") {
    // the timeline's spans ("X" events) whose name matches, in seconds: one process per rank
    const std::string path = o.dir + "/trace.json";
    if (!is_file(path)) throw QuantityError(where + ": " + missing(o, "trace.json"));
    const nlohmann::json& doc = json_file(path);
    const nlohmann::json* events = doc.is_object() && doc.contains("traceEvents") ? &doc["traceEvents"] : &doc;
    if (!events->is_array()) throw QuantityError(where + ": " + path + " holds no traceEvents array");
    std::vector<Value> vals;
    std::set<std::string> names;
    int64_t last_step = -1;
    for (const nlohmann::json& e : *events) {
      if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("name") || !e["name"].is_string()) continue;
      const std::string name = e["name"].get<std::string>();
      names.insert(name);
      if (fnmatch(q.path.c_str(), name.c_str(), 0) != 0) continue;
      if (q.rank && (!e.contains("pid") || !e["pid"].is_number_integer() || e["pid"].get<int64_t>() != *q.rank)) continue;
      const nlohmann::json* args = e.contains("args") && e["args"].is_object() ? &e["args"] : nullptr;
      const bool has_step = args && args->contains("step") && (*args)["step"].is_number_integer();
      if (has_step) last_step = std::max(last_step, (*args)["step"].get<int64_t>());
      if (q.step && (!has_step || (*args)["step"].get<int64_t>() != *q.step)) continue;
      if (!e.contains("dur") || !e["dur"].is_number())
        throw QuantityError(where + ": " + path + ": the span '" + name + "' has no duration (dur)");
      vals.push_back(Value::num(e["dur"].get<double>() * 1e-6));  // microseconds in the file
    }
    if (vals.empty()) {
      std::string known;
      for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
      throw QuantityError(where + ": no span of trace.json matches '" + q.path + "'" +
                          (q.rank ? " on rank " + std::to_string(*q.rank) : "") +
                          (q.step ? " at step " + std::to_string(*q.step) + " (it records steps 0.." + std::to_string(last_step) +
                                    ": --trace-steps)" : "") + " (spans: " + known + ")");
    }
    if (q.reduce.empty()) {
      if (vals.size() == 1) return vals[0];
      throw QuantityError(where + ": " + std::to_string(vals.size()) + " spans of trace.json match '" + q.path +
                          "': filter by rank or step, or add reduce (min, mean, series, ...)");
    }
    return reduce_values(vals, q.reduce, where);
  }
  throw QuantityError(where + ": unknown source '" + q.source + "'");
}

}  // namespace lessons
