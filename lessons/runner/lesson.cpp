// Reading and checking lesson files: sections
//   1. diagnostics and small helpers
//   2. the Reader: typed access to TOML with positions, unknown keys
//   3. the parts of a lesson: predictions, runs, quantities, observe, checks, hints
//   4. cross-references: names, runs, cycles, hints for every prediction
//   5. load_lesson / parse_lesson
//   6. placeholders and number formats
//   7. requirements
#include "lesson.h"
#include "mutation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "backends.h"
#include "config_effects.h"
#include "dataset.h"
#include "gemm.h"
#include "machine.h"
#include "simulate.h"
#include "toml_parse.h"

namespace lessons {

// ---- 1. diagnostics and small helpers ----

std::string Diagnostic::format() const {
  std::ostringstream s;
  s << file;
  if (pos.line > 0) s << ":" << pos.line << ":" << std::max(1, pos.col);
  s << ": " << message;
  return s.str();
}

namespace {

std::string join_diagnostics(const std::string& file, const std::vector<Diagnostic>& d) {
  std::string out = d.size() == 1 ? d[0].format() : file + ": " + std::to_string(d.size()) + " problems";
  if (d.size() > 1)
    for (const Diagnostic& x : d) out += "\n  " + x.format();
  return out;
}

std::string quote_list(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

const std::regex kIdPattern("^[a-z0-9][a-z0-9-]*$");
const std::regex kNamePattern("^[A-Za-z_][A-Za-z0-9_]*$");

}  // namespace

LessonError::LessonError(const std::string& file, std::vector<Diagnostic> diagnostics)
    : lab::ConfigError(join_diagnostics(file, diagnostics),
                       "lessons/README.md describes the format; `dtlab lesson check FILE` lists every problem"),
      m_diagnostics(std::move(diagnostics)) {}

// ---- 2. the Reader ----

namespace {

SourcePos pos_of(const toml::source_region& r) { return {static_cast<int>(r.begin.line), static_cast<int>(r.begin.column)}; }

class Reader {
 public:
  explicit Reader(std::string file) : m_file(std::move(file)) {}
  const std::string& file() const { return m_file; }
  std::vector<Diagnostic>& diagnostics() { return m_diags; }

  void error(SourcePos p, const std::string& msg) { m_diags.push_back({m_file, p, msg}); }

  // Every key of `t` must be one of `known`; `where` names the table in messages.
  void known_keys(const toml::table& t, const std::string& where, const std::vector<std::string>& known) {
    for (const auto& [k, v] : t) {
      const std::string key(k.str());
      if (std::find(known.begin(), known.end(), key) == known.end())
        error(pos_of(k.source()), "unknown key '" + key + "' in " + where + " (known: " + quote_list(known) + ")");
    }
  }

  SourcePos pos(const toml::table& t, const std::string& key) {
    for (const auto& [k, v] : t)
      if (k.str() == key) return pos_of(k.source());
    return pos_of(t.source());
  }

  std::optional<std::string> str(const toml::table& t, const std::string& key, const std::string& where, bool required) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) error(pos_of(t.source()), "missing key '" + key + "' in " + where);
      return std::nullopt;
    }
    if (auto v = n->value<std::string>()) return *v;
    error(pos_of(n->source()), "key '" + key + "' in " + where + " must be a string, got " + type_of(*n));
    return std::nullopt;
  }
  std::optional<int64_t> integer(const toml::table& t, const std::string& key, const std::string& where, bool required) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) error(pos_of(t.source()), "missing key '" + key + "' in " + where);
      return std::nullopt;
    }
    if (n->is_integer()) return n->value<int64_t>();
    error(pos_of(n->source()), "key '" + key + "' in " + where + " must be an integer, got " + type_of(*n));
    return std::nullopt;
  }
  std::optional<double> number(const toml::table& t, const std::string& key, const std::string& where, bool required) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) error(pos_of(t.source()), "missing key '" + key + "' in " + where);
      return std::nullopt;
    }
    if (n->is_integer() || n->is_floating_point()) return n->value<double>();
    error(pos_of(n->source()), "key '" + key + "' in " + where + " must be a number, got " + type_of(*n));
    return std::nullopt;
  }
  std::optional<bool> boolean(const toml::table& t, const std::string& key, const std::string& where) {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    if (n->is_boolean()) return n->value<bool>();
    error(pos_of(n->source()), "key '" + key + "' in " + where + " must be true or false, got " + type_of(*n));
    return std::nullopt;
  }
  std::vector<std::string> strings(const toml::table& t, const std::string& key, const std::string& where) {
    std::vector<std::string> out;
    const toml::node* n = t.get(key);
    if (!n) return out;
    const toml::array* a = n->as_array();
    if (!a) {
      error(pos_of(n->source()), "key '" + key + "' in " + where + " must be an array of strings, got " + type_of(*n));
      return out;
    }
    for (const toml::node& e : *a) {
      if (auto v = e.value<std::string>()) out.push_back(*v);
      else error(pos_of(e.source()), "key '" + key + "' in " + where + " must hold strings, got " + type_of(e));
    }
    return out;
  }
  const toml::table* table(const toml::table& t, const std::string& key, const std::string& where, bool required) {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) error(pos_of(t.source()), "missing table [" + key + "] in " + where);
      return nullptr;
    }
    if (const toml::table* tt = n->as_table()) return tt;
    error(pos_of(n->source()), "'" + key + "' in " + where + " must be a table, got " + type_of(*n));
    return nullptr;
  }
  // [[key]] arrays of tables (also accepts a single [key] table, as one element).
  std::vector<const toml::table*> tables(const toml::table& t, const std::string& key, const std::string& where) {
    std::vector<const toml::table*> out;
    const toml::node* n = t.get(key);
    if (!n) return out;
    if (const toml::table* one = n->as_table()) return {one};
    const toml::array* a = n->as_array();
    if (!a) {
      error(pos_of(n->source()), "'" + key + "' in " + where + " must be an array of tables ([[" + key + "]]), got " + type_of(*n));
      return out;
    }
    for (const toml::node& e : *a) {
      if (const toml::table* tt = e.as_table()) out.push_back(tt);
      else error(pos_of(e.source()), "'" + key + "' in " + where + " must hold tables ([[" + key + "]]), got " + type_of(e));
    }
    return out;
  }

  // An expression in a string value; parse errors point at the character in the file.
  Expr expr(const toml::table& t, const std::string& key, const std::string& where, bool required) {
    const toml::node* n = t.get(key);
    const auto text = str(t, key, where, required);
    if (!text || !n) return {};
    try {
      return Expr::parse(*text);
    } catch (const ExprError& e) {
      error(at_offset(*n, *text, e.offset()), "in " + key + " of " + where + ": " + e.what());
    }
    return {};
  }

  // The position of character `offset` of a string value (exact for one-line strings; the
  // value's start otherwise).
  static SourcePos at_offset(const toml::node& n, const std::string& text, int offset) {
    SourcePos p = pos_of(n.source());
    if (offset >= 0 && n.source().begin.line == n.source().end.line && text.find('\n') == std::string::npos)
      p.col += 1 + offset;
    return p;
  }

  static std::string type_of(const toml::node& n) {
    switch (n.type()) {
      case toml::node_type::string: return "a string";
      case toml::node_type::integer: return "an integer";
      case toml::node_type::floating_point: return "a number";
      case toml::node_type::boolean: return "a boolean";
      case toml::node_type::array: return "an array";
      case toml::node_type::table: return "a table";
      default: return "a date or time";
    }
  }

 private:
  std::string m_file;
  std::vector<Diagnostic> m_diags;
};

// ---- 3. the parts of a lesson ----

const std::vector<std::string> kViews = {"ring", "batchnorm", "batching", "traineval", "bench", "memory", "pipeline", "scale"};
const std::vector<std::string> kSources = {"summary", "metrics", "trace", "tensor", "result", "config", "exit_code", "error", "expr"};
const std::vector<std::string> kReduces = {"last", "first", "mean", "sum", "min", "max", "spread", "std", "count", "series"};

void read_predictions(Reader& rd, const toml::table& t, const std::string& where, Part& part) {
  for (const toml::table* p : rd.tables(t, "predict", where)) {
    Prediction pr;
    pr.pos = pos_of(p->source());
    const std::string w = "[[predict]] of " + where;
    rd.known_keys(*p, w, {"id", "kind", "prompt", "choices", "answer", "rtol", "atol", "unit", "ask_why", "confidence"});
    pr.id = rd.str(*p, "id", w, true).value_or("");
    if (!pr.id.empty() && !std::regex_match(pr.id, kNamePattern))
      rd.error(rd.pos(*p, "id"), "prediction id '" + pr.id + "' must be a name: letters, digits and _");
    pr.kind = rd.str(*p, "kind", w, true).value_or("");
    pr.prompt = rd.str(*p, "prompt", w, true).value_or("");
    pr.ask_why = rd.boolean(*p, "ask_why", w).value_or(false);
    pr.confidence = rd.boolean(*p, "confidence", w).value_or(true);
    const std::string pw = "prediction '" + pr.id + "'";
    if (pr.kind == "choice") {
      for (const char* k : {"answer", "rtol", "atol", "unit"})
        if (p->get(k)) rd.error(rd.pos(*p, k), "'" + std::string(k) + "' belongs to numeric predictions; " + pw + " is a choice");
      std::set<std::string> keys;
      for (const toml::table* c : rd.tables(*p, "choices", pw)) {
        Choice ch;
        ch.pos = pos_of(c->source());
        const std::string cw = "a choice of " + pw;
        rd.known_keys(*c, cw, {"key", "text", "correct_if", "misconception"});
        ch.key = rd.str(*c, "key", cw, true).value_or("");
        ch.text = rd.str(*c, "text", cw, true).value_or("");
        ch.misconception = rd.str(*c, "misconception", cw, false).value_or("");
        if (!c->get("correct_if"))
          rd.error(ch.pos, "choice '" + ch.key + "' of " + pw + " has no correct_if: which answer is right is a predicate "
                                                          "over measured quantities, never a typed key");
        ch.correct_if = rd.expr(*c, "correct_if", "choice '" + ch.key + "' of " + pw, false);
        if (!ch.key.empty() && !keys.insert(ch.key).second)
          rd.error(rd.pos(*c, "key"), "choice key '" + ch.key + "' appears twice in " + pw);
        if (!ch.key.empty() && (ch.key.find_first_of(",= \t") != std::string::npos))
          rd.error(rd.pos(*c, "key"), "choice key '" + ch.key + "' must not contain spaces, ',' or '='");
        pr.choices.push_back(std::move(ch));
      }
      if (pr.choices.size() < 2) rd.error(pr.pos, pw + " needs at least two [[predict.choices]]");
    } else if (pr.kind == "numeric") {
      if (p->get("choices")) rd.error(rd.pos(*p, "choices"), "choices belong to choice predictions; " + pw + " is numeric");
      if (!p->get("answer"))
        rd.error(pr.pos, pw + " has no answer: a numeric prediction is right when it is close to a measured "
                              "quantity (answer = \"expression\", with rtol and/or atol)");
      pr.answer = rd.expr(*p, "answer", pw, false);
      pr.rtol = rd.number(*p, "rtol", pw, false).value_or(0);
      pr.atol = rd.number(*p, "atol", pw, false).value_or(0);
      pr.unit = rd.str(*p, "unit", pw, false).value_or("");
      if (pr.rtol < 0 || pr.atol < 0) rd.error(pr.pos, pw + ": rtol and atol must be >= 0");
      if (!(pr.rtol > 0 || pr.atol > 0))
        rd.error(pr.pos, pw + " needs a tolerance: rtol (relative, e.g. 0.1) and/or atol (absolute), both >= 0, one > 0");
    } else if (!pr.kind.empty()) {
      rd.error(rd.pos(*p, "kind"), "kind of " + pw + " must be \"choice\" or \"numeric\", got \"" + pr.kind + "\"");
    }
    part.predictions.push_back(std::move(pr));
  }
}

void read_runs(Reader& rd, const toml::table& t, const std::string& where, Part& part) {
  const toml::table* runs = rd.table(t, "runs", where, false);
  if (!runs) return;
  for (const auto& [k, v] : *runs) {
    RunSpec r;
    r.name = std::string(k.str());
    r.pos = pos_of(k.source());
    const std::string w = "run '" + r.name + "'";
    if (!std::regex_match(r.name, kNamePattern)) rd.error(r.pos, "run name '" + r.name + "' must be a name: letters, digits and _");
    const toml::table* rt = v.as_table();
    if (!rt) {
      rd.error(pos_of(v.source()), w + " must be a table ([runs." + r.name + "])");
      continue;
    }
    rd.known_keys(*rt, w, {"command", "args", "base", "expect_exit", "expect_error"});
    r.command = rd.str(*rt, "command", w, false).value_or("run");
    r.args_text = rd.str(*rt, "args", w, false).value_or("");
    r.base = rd.str(*rt, "base", w, false).value_or("");
    r.expect_exit = static_cast<int>(rd.integer(*rt, "expect_exit", w, false).value_or(0));
    r.expect_error = rd.str(*rt, "expect_error", w, false).value_or("");
    if (!r.expect_error.empty() && r.expect_exit == 0)
      rd.error(rd.pos(*rt, "expect_error"), w + ": expect_error needs expect_exit (the exit code of the error)");
    const auto& cmds = commands::lesson_commands();
    if (std::find(cmds.begin(), cmds.end(), r.command) == cmds.end())
      rd.error(rd.pos(*rt, "command"), w + ": unknown command '" + r.command + "' (known: " + quote_list(cmds) + ")");
    part.runs.push_back(std::move(r));
  }
  std::stable_sort(part.runs.begin(), part.runs.end(), [](const RunSpec& a, const RunSpec& b) {
    return a.pos.line != b.pos.line ? a.pos.line < b.pos.line : a.pos.col < b.pos.col;
  });
}

// field = "busbw_GBps" and where = { algorithm = "ring", ranks = [512, 1024], nccl_choice = "tree/*" }
// of a summary or result quantity (lesson.h, WhereTerm).
void read_field_and_where(Reader& rd, const toml::table& qt, const std::string& w, QuantitySpec& q) {
  if (qt.get("field")) {
    q.field = rd.str(qt, "field", w, false).value_or("");
    if (q.field.empty() || q.field.front() == '.' || q.field.back() == '.' || q.field.find("..") != std::string::npos ||
        q.field.find('/') != std::string::npos)
      rd.error(rd.pos(qt, "field"), w + ": field names a field of each element, e.g. \"busbw_GBps\" (a dotted path "
                                      "for nested objects; the JSON pointer before it names the array)");
  }
  const toml::node* n = qt.get("where");
  if (!n) return;
  const toml::table* wt = n->as_table();
  if (!wt) {
    rd.error(pos_of(n->source()), w + ": where is a table of conditions, e.g. where = { algorithm = \"ring\", ranks = 1024 }");
    return;
  }
  if (wt->empty()) rd.error(pos_of(n->source()), w + ": where has no condition (leave it out to take every element)");
  auto one = [&](const toml::node& v, const std::string& key, nlohmann::json& out) {
    if (v.is_integer()) out = *v.value<int64_t>();
    else if (v.is_floating_point()) out = *v.value<double>();
    else if (v.is_string()) out = *v.value<std::string>();
    else if (v.is_boolean()) out = *v.value<bool>();
    else {
      rd.error(pos_of(v.source()), w + ": where." + key + " must be a number, a string (a glob: \"tree/*\"), a boolean "
                                       "or an array of them (any of them), got " + Reader::type_of(v));
      return false;
    }
    return true;
  };
  for (const auto& [k, v] : *wt) {
    WhereTerm term;
    term.key = std::string(k.str());
    term.pos = pos_of(k.source());
    if (const toml::array* a = v.as_array()) {
      if (a->empty()) rd.error(pos_of(v.source()), w + ": where." + term.key + " = [] matches nothing");
      for (const toml::node& e : *a) {
        nlohmann::json j;
        if (one(e, term.key, j)) term.values.push_back(std::move(j));
      }
    } else {
      nlohmann::json j;
      if (one(v, term.key, j)) term.values.push_back(std::move(j));
    }
    q.where.push_back(std::move(term));
  }
}

void read_quantities(Reader& rd, const toml::table& t, const std::string& where, Part& part) {
  const toml::table* qs = rd.table(t, "quantities", where, false);
  if (!qs) return;
  for (const auto& [k, v] : *qs) {
    QuantitySpec q;
    q.name = std::string(k.str());
    q.pos = pos_of(k.source());
    const std::string w = "quantity '" + q.name + "'";
    if (!std::regex_match(q.name, kNamePattern))
      rd.error(q.pos, "quantity name '" + q.name + "' must be a name: letters, digits and _");
    const toml::table* qt = v.as_table();
    if (!qt) {
      rd.error(pos_of(v.source()), w + " must be a table ([quantities." + q.name + "] or name = { ... })");
      continue;
    }
    rd.known_keys(*qt, w, {"run", "summary", "metrics", "trace", "tensor", "result", "config", "exit_code", "error", "expr", "file",
                           "rank", "kind", "step", "epoch", "layer", "channel", "reduce", "field", "where", "what", "unit"});
    std::vector<std::string> given;
    for (const std::string& s : kSources)
      if (qt->get(s)) given.push_back(s);
    if (given.size() != 1) {
      rd.error(q.pos, w + (given.empty() ? " has no source" : " has several sources (" + quote_list(given) + ")") +
                          ": give exactly one of " + quote_list(kSources));
    } else {
      q.source = given[0];
    }
    q.what = rd.str(*qt, "what", w, false).value_or("");
    q.unit = rd.str(*qt, "unit", w, false).value_or("");
    if (q.source == "expr") {
      q.expr = rd.expr(*qt, "expr", w, true);
      if (qt->get("run")) rd.error(rd.pos(*qt, "run"), w + ": an expr quantity is computed from other quantities, not read from a run");
    } else if (!q.source.empty()) {
      q.run = rd.str(*qt, "run", w, true).value_or("");
    }
    if (q.source == "exit_code" || q.source == "error") {
      if (!rd.boolean(*qt, q.source, w).value_or(false))
        rd.error(rd.pos(*qt, q.source), w + ": write " + q.source + " = true");
    } else if (q.source == "summary" || q.source == "result") {
      q.path = rd.str(*qt, q.source, w, true).value_or("");
      if (!q.path.empty() && q.path[0] != '/')
        rd.error(rd.pos(*qt, q.source), w + ": " + q.source + " is a JSON pointer and starts with '/', e.g. \"/test_eval_mode/accuracy\"");
    } else if (!q.source.empty() && q.source != "expr") {
      q.path = rd.str(*qt, q.source, w, true).value_or("");
    }
    // filters: which apply to which source
    const bool metrics = q.source == "metrics", tensor = q.source == "tensor", trace = q.source == "trace";
    const bool json_source = q.source == "summary" || q.source == "result";
    for (const char* key : {"kind", "step", "epoch", "layer", "channel", "reduce"}) {
      const std::string k = key;
      const bool applies = metrics || (json_source && k == "reduce") || (trace && (k == "step" || k == "reduce"));
      if (qt->get(key) && !applies)
        rd.error(rd.pos(*qt, key), w + ": '" + k + "' filters metrics" + (k == "step" || k == "reduce" ? " and trace" : "") +
                                       " quantities, not " + q.source);
    }
    if (json_source) {
      read_field_and_where(rd, *qt, w, q);
      if (qt->get("reduce")) {
        q.reduce = rd.str(*qt, "reduce", w, false).value_or("");
        if (q.field.empty() && q.reduce != "count")
          rd.error(rd.pos(*qt, "reduce"), w + ": a " + q.source + " quantity takes only reduce = \"count\" (the number of "
                                           "elements of an array, or keys of an object, at the pointer), got '" + q.reduce +
                                           "'; with field (a field of each element of an array of objects) it takes any of " +
                                           quote_list(kReduces));
        else if (std::find(kReduces.begin(), kReduces.end(), q.reduce) == kReduces.end())
          rd.error(rd.pos(*qt, "reduce"), w + ": unknown reduce '" + q.reduce + "' (known: " + quote_list(kReduces) + ")");
      }
      if (qt->get("where") && q.field.empty() && q.reduce != "count")
        rd.error(rd.pos(*qt, "where"), w + ": where selects elements of the array at the pointer: name the field to read "
                                         "(field = \"busbw_GBps\"), or count them (reduce = \"count\")");
    } else {
      for (const char* key : {"field", "where"})
        if (qt->get(key))
          rd.error(rd.pos(*qt, key), w + ": '" + std::string(key) + "' reads an array of objects in a summary or result "
                                         "quantity, not " + (q.source.empty() ? "this one" : q.source));
    }
    if (qt->get("file") && !tensor) rd.error(rd.pos(*qt, "file"), w + ": 'file' names the weights file of a tensor quantity");
    if (qt->get("rank") && !metrics && !tensor && !trace)
      rd.error(rd.pos(*qt, "rank"), w + ": 'rank' applies to metrics, trace and tensor quantities");
    if (tensor) {
      q.file = rd.str(*qt, "file", w, false).value_or("final.safetensors");
      if (q.file.find('/') != std::string::npos || q.file.size() < 12 || q.file.compare(q.file.size() - 12, 12, ".safetensors") != 0)
        rd.error(rd.pos(*qt, "file"), w + ": file is a .safetensors file in the run directory, e.g. \"init.safetensors\"");
    }
    if (auto r = rd.integer(*qt, "rank", w, false)) q.rank = *r;
    if (trace) {
      if (const toml::node* s = qt->get("step")) {
        if (s->is_integer() && *s->value<int64_t>() >= 0) q.step = *s->value<int64_t>();
        else rd.error(pos_of(s->source()), w + ": step must be an iteration (0, 1, ...)");
      }
      q.reduce = rd.str(*qt, "reduce", w, false).value_or("");
      if (!q.reduce.empty() && std::find(kReduces.begin(), kReduces.end(), q.reduce) == kReduces.end())
        rd.error(rd.pos(*qt, "reduce"), w + ": unknown reduce '" + q.reduce + "' (known: " + quote_list(kReduces) + ")");
    }
    if (metrics) {
      q.kind = rd.str(*qt, "kind", w, false).value_or("step");
      if (q.kind != "step" && q.kind != "epoch" && q.kind != "eval")
        rd.error(rd.pos(*qt, "kind"), w + ": kind must be step, epoch or eval, got '" + q.kind + "'");
      if (const toml::node* s = qt->get("step")) {
        if (auto str = s->value<std::string>(); str && *str == "last") q.step = -1;
        else if (s->is_integer() && *s->value<int64_t>() >= 0) q.step = *s->value<int64_t>();
        else rd.error(pos_of(s->source()), w + ": step must be an iteration (0, 1, ...) or \"last\"");
      }
      if (auto e = rd.integer(*qt, "epoch", w, false)) q.epoch = *e;
      q.layer = rd.str(*qt, "layer", w, false).value_or("");
      if (auto c = rd.integer(*qt, "channel", w, false)) q.channel = *c;
      q.reduce = rd.str(*qt, "reduce", w, false).value_or("");
      if (!q.reduce.empty() && std::find(kReduces.begin(), kReduces.end(), q.reduce) == kReduces.end())
        rd.error(rd.pos(*qt, "reduce"), w + ": unknown reduce '" + q.reduce + "' (known: " + quote_list(kReduces) + ")");
      const bool bn = q.path.rfind("bn.", 0) == 0;
      if (bn && q.layer.empty())
        rd.error(q.pos, w + ": " + q.path + " is a BatchNorm statistic: name its layer (layer = \"2\" for \"2.running_mean\")");
      if (!bn && (qt->get("layer") || qt->get("channel")))
        rd.error(q.pos, w + ": layer and channel select BatchNorm statistics (fields bn.*)");
      if (bn && q.kind != "step") rd.error(q.pos, w + ": BatchNorm statistics are in step records (kind = \"step\")");
    }
    part.quantities.push_back(std::move(q));
  }
}

bool power_of_two(uint64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// nodes = 128 and size = "16M" (or 16777216): the N and S the scale view is set to. The run's own
// node counts and sizes are checked by the linker (they are known once the runs are).
void read_scale_observe(Reader& rd, const toml::table& o, const std::string& w, Observe& ob) {
  if (ob.view != "scale") {
    for (const char* key : {"nodes", "size"})
      if (o.get(key))
        rd.error(rd.pos(o, key), w + ": " + key + " chooses the " + (std::string(key) == "nodes" ? "node count" : "size") +
                                     " the scale view shows; view '" + ob.view + "' has none");
    return;
  }
  if (o.get("nodes")) {
    ob.nodes_pos = rd.pos(o, "nodes");
    ob.nodes = rd.integer(o, "nodes", w, false).value_or(-1);
    if (ob.nodes != -1 && (ob.nodes < 1 || ob.nodes > kScaleViewMaxNodes || !power_of_two(static_cast<uint64_t>(ob.nodes))))
      rd.error(ob.nodes_pos, w + ": nodes = " + std::to_string(ob.nodes) + ": the scale view shows 1, 2, 4, ... " +
                                 std::to_string(kScaleViewMaxNodes) + " nodes (a power of two)");
  }
  if (const toml::node* n = o.get("size")) {
    ob.size_pos = rd.pos(o, "size");
    if (n->is_integer()) {
      const int64_t v = *n->value<int64_t>();
      ob.bytes = v > 0 ? static_cast<uint64_t>(v) : 0;
      if (v <= 0) rd.error(ob.size_pos, w + ": size = " + std::to_string(v) + ": a size in bytes is at least 1");
    } else if (const auto text = n->value<std::string>()) {
      try {
        const std::vector<uint64_t> sizes = lab::parse_size_list(*text, 2, "size");
        if (sizes.size() != 1) throw lab::ConfigError("size = \"" + *text + "\" names " + std::to_string(sizes.size()) + " sizes");
        ob.bytes = sizes[0];
      } catch (const lab::Error& e) {
        rd.error(ob.size_pos, w + ": " + e.what() + " (one size, as --sizes writes it: \"16M\", \"1G\")");
      }
    } else {
      rd.error(ob.size_pos, w + ": size must be a size (\"16M\", \"1G\") or a number of bytes, got " + Reader::type_of(*n));
    }
    if (ob.bytes > 0 && (ob.bytes < kScaleViewMinBytes || ob.bytes > kScaleViewMaxBytes || !power_of_two(ob.bytes)))
      rd.error(ob.size_pos, w + ": size = " + std::to_string(ob.bytes) + " bytes: the scale view shows 1K, 2K, 4K, ... 8G "
                                "(a power of two from 1 KiB to 8 GiB)");
  }
}

void read_observe(Reader& rd, const toml::table& t, const std::string& where, Part& part) {
  for (const toml::table* o : rd.tables(t, "observe", where)) {
    Observe ob;
    ob.pos = pos_of(o->source());
    const std::string w = "[[observe]] of " + where;
    rd.known_keys(*o, w, {"run", "runs", "view", "layer", "channel", "step", "ring_step", "nodes", "size", "say"});
    if (o->get("run")) {
      if (auto r = rd.str(*o, "run", w, false)) ob.runs.push_back(*r);
    }
    for (const std::string& r : rd.strings(*o, "runs", w)) ob.runs.push_back(r);
    if (ob.runs.empty() || ob.runs.size() > 2)
      rd.error(ob.pos, w + ": name the run to observe (run = \"x\"), or two to show side by side (runs = [\"x\", \"y\"])");
    ob.view = rd.str(*o, "view", w, true).value_or("");
    if (!ob.view.empty() && std::find(kViews.begin(), kViews.end(), ob.view) == kViews.end())
      rd.error(rd.pos(*o, "view"), w + ": unknown view '" + ob.view + "' (known: " + quote_list(kViews) + ")");
    ob.layer = rd.str(*o, "layer", w, false).value_or("");
    ob.channel = rd.integer(*o, "channel", w, false).value_or(-1);
    ob.step = rd.integer(*o, "step", w, false).value_or(-1);
    ob.ring_step = static_cast<int>(rd.integer(*o, "ring_step", w, false).value_or(-1));
    if (ob.ring_step >= 0 && ob.step < 0) rd.error(rd.pos(*o, "ring_step"), w + ": ring_step needs step (the iteration whose allreduce)");
    ob.say = rd.str(*o, "say", w, true).value_or("");
    ob.say_pos = o->get("say") ? pos_of(o->get("say")->source()) : ob.pos;
    if (ob.view != "batchnorm" && (o->get("layer") || o->get("channel")))
      rd.error(rd.pos(*o, o->get("layer") ? "layer" : "channel"),
               w + ": layer and channel choose what the batchnorm view shows; view '" + ob.view + "' has neither");
    if (ob.view == "bench" && (o->get("step") || o->get("ring_step")))
      rd.error(rd.pos(*o, o->get("step") ? "step" : "ring_step"),
               w + ": step and ring_step choose a moment of a training run; the bench view shows a finished benchmark");
    if (ob.view == "scale" && (o->get("step") || o->get("ring_step")))
      rd.error(rd.pos(*o, o->get("step") ? "step" : "ring_step"),
               w + ": step and ring_step choose a moment of a training run; the scale view shows a finished simulation");
    read_scale_observe(rd, *o, w, ob);
    part.observe.push_back(std::move(ob));
  }
}

void read_checks(Reader& rd, const toml::table& t, const std::string& where, Part& part) {
  std::set<std::string> ids;
  for (const toml::table* c : rd.tables(t, "check", where)) {
    Check ck;
    ck.pos = pos_of(c->source());
    const std::string w = "[[check]] of " + where;
    rd.known_keys(*c, w, {"id", "that", "why", "timing", "quiet_if"});
    ck.id = rd.str(*c, "id", w, true).value_or("");
    ck.that = rd.expr(*c, "that", "check '" + ck.id + "'", true);
    ck.why = rd.str(*c, "why", w, true).value_or("");
    if (const auto timing = rd.boolean(*c, "timing", w)) {
      ck.timing = *timing;
      ck.timing_given = true;
    }
    ck.quiet_if = rd.expr(*c, "quiet_if", "check '" + ck.id + "'", false);
    if (!ck.quiet_if.empty() && !ck.timing)
      rd.error(rd.pos(*c, "quiet_if"), "check '" + ck.id + "': quiet_if says when a timing claim can be judged: add timing = true");
    if (ck.timing && ck.quiet_if.empty() && c->get("timing"))
      rd.error(rd.pos(*c, "timing"), "check '" + ck.id + "' is a timing claim: give quiet_if, when the measurement is quiet "
                                     "enough to judge it (e.g. quiet_if = \"max(noise_a, noise_b) < 0.05\": the benchmark "
                                     "rounds agree within 5%)");
    if (!ck.id.empty() && !ids.insert(ck.id).second) rd.error(rd.pos(*c, "id"), "check id '" + ck.id + "' appears twice");
    part.checks.push_back(std::move(ck));
  }
}

void read_hints(Reader& rd, const toml::table& t, const std::string& where, Part& part) {
  for (const toml::table* h : rd.tables(t, "hint", where)) {
    Hint hn;
    hn.pos = pos_of(h->source());
    const std::string w = "[[hint]] of " + where;
    rd.known_keys(*h, w, {"prediction", "text"});
    hn.prediction = rd.str(*h, "prediction", w, false).value_or("");
    hn.text = rd.str(*h, "text", w, true).value_or("");
    hn.text_pos = h->get("text") ? pos_of(h->get("text")->source()) : hn.pos;
    part.hints.push_back(std::move(hn));
  }
}

void read_explain(Reader& rd, const toml::table& t, const std::string& where, Part& part, bool required) {
  const toml::node* n = t.get("explain");
  if (!n) {
    if (required) rd.error(pos_of(t.source()), "missing [explain] in " + where + " (text = \"\"\"...\"\"\", numbers from the runs "
                                                                             "as {quantity:.3g})");
    return;
  }
  if (auto s = n->value<std::string>()) {
    part.explain = *s;
    part.explain_pos = pos_of(n->source());
    return;
  }
  const toml::table* e = n->as_table();
  if (!e) {
    rd.error(pos_of(n->source()), "explain in " + where + " must be a table with text = \"...\"");
    return;
  }
  rd.known_keys(*e, "[explain] of " + where, {"text"});
  part.explain = rd.str(*e, "text", "[explain] of " + where, true).value_or("");
  if (const toml::node* t = e->get("text")) part.explain_pos = pos_of(t->source());
}

// The sections a part (main or variation) shares.
void read_part(Reader& rd, const toml::table& t, const std::string& where, Part& part) {
  read_predictions(rd, t, where, part);
  read_runs(rd, t, where, part);
  read_quantities(rd, t, where, part);
  read_observe(rd, t, where, part);
  read_checks(rd, t, where, part);
  read_hints(rd, t, where, part);
}

// ---- 4. cross-references ----

const char* kRunPlaceholder = "{run:";

// The runs an args text reads through {run:NAME} placeholders.
std::vector<std::string> placeholder_runs(const std::string& text) {
  std::vector<std::string> out;
  for (size_t p = text.find(kRunPlaceholder); p != std::string::npos; p = text.find(kRunPlaceholder, p + 1)) {
    const size_t close = text.find('}', p);
    if (close == std::string::npos) break;
    out.push_back(text.substr(p + 5, close - p - 5));
  }
  return out;
}

class Linker {
 public:
  Linker(Reader& rd, Lesson& l) : m_rd(rd), m_l(l) {}

  void run() {
    std::set<std::string> run_names, q_names;
    for (Part* p : all_parts()) {
      for (RunSpec& r : p->runs)
        if (!run_names.insert(r.name).second) m_rd.error(r.pos, "run name '" + r.name + "' is used twice (names are shared by the lesson and its variations)");
      for (QuantitySpec& q : p->quantities)
        if (!q_names.insert(q.name).second) m_rd.error(q.pos, "quantity name '" + q.name + "' is used twice (names are shared by the lesson and its variations)");
    }
    std::set<std::string> pred_ids;
    for (Part* p : all_parts())
      for (const Prediction& pr : p->predictions)
        if (!pr.id.empty() && !pred_ids.insert(pr.id).second) m_rd.error(pr.pos, "prediction id '" + pr.id + "' is used twice");
    for (Part* p : all_parts()) link_runs(*p);
    for (Part* p : all_parts()) link_part(*p);
    before_runs(m_l.question, {1, 1}, "the question");
    before_runs(m_l.context, {1, 1}, "the question's context");
    for (const Part& v : m_l.variations) before_runs(v.text, v.pos, "the text of variation '" + v.id + "'");
  }

 private:
  std::vector<Part*> all_parts() {
    std::vector<Part*> out = {&m_l.main};
    for (Part& v : m_l.variations) out.push_back(&v);
    return out;
  }
  bool is_main(const Part& p) const { return &p == &m_l.main; }

  // A run visible from part p: its own, or the main part's.
  const RunSpec* visible_run(const Part& p, const std::string& name) const {
    for (const RunSpec& r : p.runs)
      if (r.name == name) return &r;
    if (!is_main(p))
      for (const RunSpec& r : m_l.main.runs)
        if (r.name == name) return &r;
    return nullptr;
  }
  std::vector<std::string> visible_quantity_names(const Part& p) const {
    std::vector<std::string> out;
    for (const QuantitySpec& q : p.quantities) out.push_back(q.name);
    if (!is_main(p))
      for (const QuantitySpec& q : m_l.main.quantities) out.push_back(q.name);
    return out;
  }

  // Resolves base chains and placeholders, parses the command with the CLI's definitions.
  void link_runs(Part& p) {
    for (size_t i = 0; i < p.runs.size(); ++i) {
      RunSpec& r = p.runs[i];
      std::vector<std::string> chain;
      std::vector<std::string> words;
      bool ok = true;
      // base chain, oldest first
      std::vector<const RunSpec*> bases;
      for (std::string b = r.base; !b.empty();) {
        if (std::find(chain.begin(), chain.end(), b) != chain.end() || b == r.name) {
          m_rd.error(r.pos, "run '" + r.name + "': its base chain loops (" + b + ")");
          ok = false;
          break;
        }
        chain.push_back(b);
        const RunSpec* br = visible_run(p, b);
        if (!br) {
          m_rd.error(r.pos, "run '" + r.name + "': base '" + b + "' is not a run of this " + (is_main(p) ? "lesson" : "variation or the lesson"));
          ok = false;
          break;
        }
        if (br->command != r.command) {
          m_rd.error(r.pos, "run '" + r.name + "' (" + r.command + ") cannot extend '" + b + "' (" + br->command + ")");
          ok = false;
          break;
        }
        bases.insert(bases.begin(), br);
        b = br->base;
      }
      if (!ok) continue;
      try {
        for (const RunSpec* br : bases)
          for (const std::string& w : commands::split_args(br->args_text)) words.push_back(w);
        for (const std::string& w : commands::split_args(r.args_text)) words.push_back(w);
      } catch (const lab::Error& e) {
        m_rd.error(r.pos, "run '" + r.name + "': args: " + e.what());
        continue;
      }
      r.args = words;
      for (const std::string& w : words) {
        const std::string flag = w.substr(0, w.find('='));
        if (flag == "--out" || flag == "--json")
          m_rd.error(r.pos, "run '" + r.name + "': drop " + flag + ": the lesson runner chooses where each run writes (its run "
                                                             "directory; --json for bench and eval)");
        if (flag == "--help" || flag == "-h") m_rd.error(r.pos, "run '" + r.name + "': --help is not a run");
        if (flag == "--validate" && r.command == "simulate")
          m_rd.error(r.pos, "run '" + r.name + "': drop --validate: it prints validation tables and writes no points; a "
                                               "lesson's simulate run is a sweep whose points its quantities read");
      }
      // placeholders: runs declared before this one (or the main part's, from a variation)
      std::vector<std::string> stand_in = words;
      std::string all_words;
      for (const std::string& w : words) all_words += w + " ";
      for (const std::string& ref : placeholder_runs(all_words)) {
        const RunSpec* target = visible_run(p, ref);
        bool earlier = false;
        for (size_t j = 0; j < p.runs.size(); ++j)
          if (&p.runs[j] == target) earlier = j < i;
        if (target && !is_main(p) && visible_run(m_l.main, ref) == target) earlier = true;
        if (!target) m_rd.error(r.pos, "run '" + r.name + "': {run:" + ref + "} names no run");
        else if (target == &r) m_rd.error(r.pos, "run '" + r.name + "': {run:" + ref + "} is the run itself");
        else if (!earlier) m_rd.error(r.pos, "run '" + r.name + "': {run:" + ref + "} must name a run declared before it");
        else if (std::find(r.after.begin(), r.after.end(), ref) == r.after.end()) r.after.push_back(ref);
      }
      for (std::string& w : stand_in)
        for (size_t at = w.find(kRunPlaceholder); at != std::string::npos; at = w.find(kRunPlaceholder)) {
          const size_t close = w.find('}', at);
          if (close == std::string::npos) break;
          w.replace(at, close - at + 1, "/lesson-run-dir/" + w.substr(at + 5, close - at - 5));
        }
      // --resume {run:X}: the configuration X's checkpoints will hold (X must write some)
      auto stand_in_config = [&](const std::string& dir) -> const lab::RunConfig* {
        const std::string prefix = "/lesson-run-dir/";
        if (dir.rfind(prefix, 0) != 0) return nullptr;
        const RunSpec* target = visible_run(p, dir.substr(prefix.size()));
        if (!target || target->command != "run") return nullptr;
        if (target->parsed.run.checkpoint_every == 0 && !target->parsed.run.checkpoint_every_epoch)
          throw lab::ConfigError("--resume {run:" + target->name + "}: run '" + target->name + "' writes no checkpoint",
                                 "give it --checkpoint-every N or --checkpoint-every-epoch");
        return &target->parsed.run;
      };
      if (r.command == "run") {  // as the runner will run it: into its own directory
        stand_in.push_back("--out");
        stand_in.push_back("/lesson-run-dir/" + r.name);
      }
      try {
        r.parsed = commands::parse_command(r.command, stand_in, stand_in_config);
        r.parsed.args = words;
        if (r.command == "run" && r.parsed.run.comm == "mpi" &&
            std::find(m_l.requires_.begin(), m_l.requires_.end(), "mpi") == m_l.requires_.end())
          m_rd.error(r.pos, "run '" + r.name + "' uses --comm mpi: add \"mpi\" to requires");
        check_effects(r, words, bases);
      } catch (const lab::Error& e) {
        // said once, at the run that has the bad flag, not again at every run extending it
        bool bad_base = false;
        for (const RunSpec* br : bases) bad_base |= m_failed_runs.count(br->name) > 0;
        m_failed_runs.insert(r.name);
        if (bad_base) continue;
        m_rd.error(r.pos, "run '" + r.name + "': " + commands::command_line(r.command, words) + ": " + e.what() +
                              (e.hint().empty() ? "" : " (" + e.hint() + ")"));
      }
    }
  }

  // A flag that has no effect in its run (lab/core/config_effects.h, the rules dtlab run warns
  // with): a lesson shows what matters, so it is a problem of the file. Said once, at the run that
  // gives the flag, not again at every run extending it.
  void check_effects(const RunSpec& r, const std::vector<std::string>& words, const std::vector<const RunSpec*>& bases) {
    std::vector<lab::IneffectiveSetting> none;
    if (r.command == "run") none = lab::ineffective_settings(r.parsed.run);
    else if (r.command == "bench train") none = lab::bench_train_ineffective(r.parsed.bench_train);
    for (const lab::IneffectiveSetting& e : none) {
      const std::string m = e.message();
      bool from_base = false;
      for (const RunSpec* br : bases) from_base |= m_no_effect[br->name].count(m) > 0;
      m_no_effect[r.name].insert(m);
      if (!from_base)
        m_rd.error(r.pos, "run '" + r.name + "': " + commands::command_line(r.command, words) + ": " + m +
                              (e.hint.empty() ? "" : " (" + e.hint + ")") + "; drop the flag");
    }
  }

  void check_names(const Part& p, const Expr& e, SourcePos pos, const std::string& where) {
    for (const auto& [name, offset] : e.names())
      if (!m_l.visible_quantity(p, name))
        m_rd.error(pos, where + ": '" + name + "' is not a quantity" + suggestion(p, name) + " (quantities: " +
                            quote_list(visible_quantity_names(p)) + ")");
  }

  std::string suggestion(const Part& p, const std::string& name) const {
    // the closest name by edit distance, when it is close
    std::string best;
    size_t best_d = 3;
    for (const std::string& q : visible_quantity_names(p)) {
      std::vector<size_t> prev(q.size() + 1), cur(q.size() + 1);
      for (size_t j = 0; j <= q.size(); ++j) prev[j] = j;
      for (size_t i = 1; i <= name.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= q.size(); ++j)
          cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (name[i - 1] == q[j - 1] ? 0 : 1)});
        std::swap(prev, cur);
      }
      if (prev[q.size()] < best_d) {
        best_d = prev[q.size()];
        best = q;
      }
    }
    return best.empty() ? "" : " (did you mean '" + best + "'?)";
  }

  // A check that reads a measured time says what kind of claim it is (lesson.h, Check): a claim
  // about speed is judged only when the machine was quiet enough; an identity is judged always.
  void check_timing(const Part& p, const Check& c) {
    std::vector<std::string> timings;
    for (const auto& [name, off] : c.that.names()) {
      const QuantitySpec* q = m_l.visible_quantity(p, name);
      if (q && is_timing_quantity(m_l, p, *q) && std::find(timings.begin(), timings.end(), name) == timings.end())
        timings.push_back(name);
    }
    // A check that reads times and says nothing is judged on every machine (timing = false), as
    // every check was before timing existed; the guide (lessons/README.md, section 7) asks new
    // lessons to say which it is.
    if (timings.empty() && c.timing) m_rd.error(c.pos, "check '" + c.id + "' reads no measured time: drop timing = true (it is judged on every machine)");
  }

  // Texts the learner reads before anything runs (the question, prompts, choices) hold no
  // placeholders: there is nothing measured yet.
  void before_runs(const std::string& text, SourcePos pos, const std::string& where) {
    try {
      if (!find_placeholders(text).empty())
        m_rd.error(pos, where + " is shown before the runs, so it cannot hold {placeholders}; numbers belong in "
                                "explain, observe say, hints and misconceptions (write {{ and }} for literal braces)");
    } catch (const ExprError& e) {
      m_rd.error(pos, where + ": " + e.what() + " (write {{ and }} for literal braces)");
    }
  }

  void check_text(const Part& p, const std::string& text, SourcePos pos, const std::string& where) {
    try {
      for (const Placeholder& ph : find_placeholders(text)) check_names(p, ph.expr, pos, where);
    } catch (const ExprError& e) {
      m_rd.error(pos, where + ": " + e.what());
    }
  }

  void link_part(Part& p) {
    const std::string where = is_main(p) ? "the lesson" : "variation '" + p.id + "'";
    for (QuantitySpec& q : p.quantities) {
      if (q.source == "expr") check_names(p, q.expr, q.pos, "quantity '" + q.name + "'");
      else if (!q.run.empty() && !visible_run(p, q.run))
        m_rd.error(q.pos, "quantity '" + q.name + "': run '" + q.run + "' is not a run of " + where);
      else if (!q.run.empty() && q.source != "exit_code" && q.source != "error") {
        const RunSpec* r = visible_run(p, q.run);
        const bool is_run = r->command == "run";
        if ((q.source == "summary" || q.source == "metrics" || q.source == "trace" || q.source == "tensor" || q.source == "config") &&
            !is_run)
          m_rd.error(q.pos, "quantity '" + q.name + "': " + q.source + " comes from a training run's directory; run '" + q.run +
                                "' is `dtlab " + r->command + "`: read its output with result = \"/json/pointer\"");
        if (q.source == "result" && is_run)
          m_rd.error(q.pos, "quantity '" + q.name + "': result reads the JSON of bench, eval and simulate commands; run '" + q.run +
                                "' trains: read summary = \"/json/pointer\" or metrics");
      }
    }
    // expr quantities must not depend on themselves
    std::map<std::string, int> state;  // 1: visiting, 2: done
    std::function<void(const QuantitySpec&)> visit = [&](const QuantitySpec& q) {
      state[q.name] = 1;
      for (const auto& [name, off] : q.expr.names()) {
        const QuantitySpec* d = m_l.visible_quantity(p, name);
        if (!d || d->source != "expr") continue;
        if (state[name] == 1) m_rd.error(q.pos, "quantity '" + q.name + "' depends on itself through '" + name + "'");
        else if (state[name] == 0) visit(*d);
      }
      state[q.name] = 2;
    };
    for (const QuantitySpec& q : p.quantities)
      if (q.source == "expr" && state[q.name] == 0) visit(q);
    for (const Prediction& pr : p.predictions) {
      // shown before the runs: nothing to fill in yet
      before_runs(pr.prompt, pr.pos, "prompt of prediction '" + pr.id + "'");
      for (const Choice& c : pr.choices) {
        before_runs(c.text, c.pos, "text of choice '" + c.key + "' of prediction '" + pr.id + "'");
        check_text(p, c.misconception, c.pos, "misconception of choice '" + c.key + "'");
      }
      for (const Choice& c : pr.choices) check_names(p, c.correct_if, c.pos, "choice '" + c.key + "' of prediction '" + pr.id + "'");
      if (pr.kind == "numeric") check_names(p, pr.answer, pr.pos, "answer of prediction '" + pr.id + "'");
      bool hinted = false;
      for (const Hint& h : p.hints) hinted |= h.prediction.empty() || h.prediction == pr.id;
      if (!hinted)
        m_rd.error(pr.pos, "prediction '" + pr.id + "' has no hint: add [[hint]] with prediction = \"" + pr.id +
                               "\" (shown after a wrong answer)");
    }
    for (const Hint& h : p.hints) {
      check_text(p, h.text, h.text_pos, "hint");
      bool found = h.prediction.empty();
      for (const Prediction& pr : p.predictions) found |= pr.id == h.prediction;
      if (!found) m_rd.error(h.pos, "hint for prediction '" + h.prediction + "': no such prediction in " + where);
    }
    for (const Check& c : p.checks) {
      check_names(p, c.that, c.pos, "check '" + c.id + "'");
      if (!c.quiet_if.empty()) check_names(p, c.quiet_if, c.pos, "quiet_if of check '" + c.id + "'");
      check_timing(p, c);
    }
    for (const Observe& o : p.observe) {
      for (const std::string& r : o.runs) {
        const RunSpec* rs = visible_run(p, r);
        if (!rs) {
          m_rd.error(o.pos, "[[observe]]: run '" + r + "' is not a run of " + where);
        } else if (o.view == "bench") {
          // the Benchmark view plots bench train's sweep or per-sample comparison, and bench chain
          if (rs->command != "bench train" && rs->command != "bench chain")
            m_rd.error(o.pos, "[[observe]]: run '" + r + "' is `dtlab " + rs->command + "`: the bench view shows `dtlab "
                              "bench train` (with --batch-sizes or --per-sample) and `dtlab bench chain` results");
          else if (rs->command == "bench train" && !m_failed_runs.count(rs->name) &&
                   rs->parsed.bench_train.batch_sizes.empty() && !rs->parsed.bench_train.per_sample)
            m_rd.error(o.pos, "[[observe]]: run '" + r + "' times one batch size: the bench view plots a sweep "
                              "(--batch-sizes 2,8,32,128,512) or the per-sample comparison (--per-sample)");
        } else if (o.view == "scale") {
          if (rs->command != "simulate")
            m_rd.error(o.pos, "[[observe]]: run '" + r + "' is `dtlab " + rs->command + "`: the scale view shows `dtlab "
                              "simulate` results");
          else if (o.runs.size() > 1)
            m_rd.error(o.pos, "[[observe]]: the scale view shows one simulate run (run = \"" + o.runs[0] + "\")");
          else if (!m_failed_runs.count(rs->name))
            check_scale_observe(o, *rs);
        } else if (rs->command != "run") {
          m_rd.error(o.pos, "[[observe]]: run '" + r + "' is `dtlab " + rs->command + "`: the app's views show training "
                            "runs (view = \"bench\" shows bench train and bench chain results, view = \"scale\" "
                            "simulate results)");
        }
      }
      check_text(p, o.say, o.say_pos, "[[observe]] say");
    }
    check_text(p, p.explain, p.explain_pos.line ? p.explain_pos : p.pos, "explain of " + where);
    if (p.predictions.empty()) m_rd.error(p.pos, where + " has no [[predict]]: a lesson asks for a prediction before it runs anything");
    if (p.runs.empty() && is_main(p)) m_rd.error(p.pos, "the lesson has no [runs.NAME]: what answers the question?");
    if (p.checks.empty()) m_rd.error(p.pos, where + " has no [[check]]: the checks verify the lesson's claim on every CI run");
  }

  // The scale view's N and S (nodes, size) are among the node counts and sizes the run simulates:
  // the view is set up from the run, and what the observation says comes from its points.
  void check_scale_observe(const Observe& o, const RunSpec& rs) {
    if (o.nodes < 0 && o.bytes == 0) return;
    std::vector<int> nodes;
    std::vector<uint64_t> sizes;
    try {
      nodes = lab::parse_int_list(rs.parsed.simulate.nodes, "--nodes");
      sizes = lab::parse_size_list(rs.parsed.simulate.sizes, rs.parsed.simulate.step_factor, "--sizes");
    } catch (const lab::Error&) {
      return;  // reported with the run
    }
    if (o.nodes > 0 && std::find(nodes.begin(), nodes.end(), o.nodes) == nodes.end())
      m_rd.error(o.nodes_pos, "[[observe]]: nodes = " + std::to_string(o.nodes) + " is not among the node counts run '" +
                                  rs.name + "' simulates (--nodes " + rs.parsed.simulate.nodes + ")");
    if (o.bytes > 0 && std::find(sizes.begin(), sizes.end(), o.bytes) == sizes.end())
      m_rd.error(o.size_pos, "[[observe]]: size = " + lab::size_text(o.bytes) + " is not among the sizes run '" + rs.name +
                                 "' simulates (--sizes " + rs.parsed.simulate.sizes + ")");
  }

  Reader& m_rd;
  Lesson& m_l;
  std::set<std::string> m_failed_runs;  // runs whose flags did not parse
  std::map<std::string, std::set<std::string>> m_no_effect;  // run -> its flags' no-effect messages
};

}  // namespace

// ---- [[torch_check]] and [[mutation]] (lesson.h) ----

namespace {

void read_torch_checks_and_mutations(Reader& rd, const toml::table& t, Lesson& l) {
  std::set<std::string> ids;
  for (const toml::table* c : rd.tables(t, "torch_check", "the top level")) {
    TorchCheck tc;
    tc.pos = pos_of(c->source());
    rd.known_keys(*c, "[[torch_check]]", {"id", "claim", "script", "cite"});
    tc.id = rd.str(*c, "id", "[[torch_check]]", true).value_or("");
    const std::string w = "torch_check '" + tc.id + "'";
    if (!tc.id.empty() && !std::regex_match(tc.id, kNamePattern))
      rd.error(rd.pos(*c, "id"), w + ": id must be a name (letters, digits and _)");
    if (!tc.id.empty() && !ids.insert(tc.id).second) rd.error(rd.pos(*c, "id"), w + " appears twice");
    tc.claim = rd.str(*c, "claim", w, true).value_or("");
    tc.script = rd.str(*c, "script", w, false).value_or("");
    tc.cite = rd.str(*c, "cite", w, false).value_or("");
    if (tc.script.empty() == tc.cite.empty())
      rd.error(tc.pos, w + ": give either script (a python3-torch program that checks the claim) or cite (the PyTorch "
                           "1.13 source it rests on), one of them");
    if (!tc.script.empty()) {
      const std::filesystem::path file = std::filesystem::path(l.file).parent_path() / tc.script;
      std::error_code ec;
      if (!std::filesystem::is_regular_file(file, ec))
        rd.error(rd.pos(*c, "script"), w + ": no file " + file.string() + " (the path is relative to the lesson's folder)");
    }
    l.torch_checks.push_back(std::move(tc));
  }
  ids.clear();
  for (const toml::table* m : rd.tables(t, "mutation", "the top level")) {
    Mutation mu;
    mu.pos = pos_of(m->source());
    rd.known_keys(*m, "[[mutation]]", {"id", "what", "lab", "args", "runs", "breaks", "timing"});
    mu.id = rd.str(*m, "id", "[[mutation]]", true).value_or("");
    const std::string w = "mutation '" + mu.id + "'";
    if (!mu.id.empty() && !std::regex_match(mu.id, kNamePattern))
      rd.error(rd.pos(*m, "id"), w + ": id must be a name (letters, digits and _)");
    if (!mu.id.empty() && !ids.insert(mu.id).second) rd.error(rd.pos(*m, "id"), w + " appears twice");
    mu.what = rd.str(*m, "what", w, true).value_or("");
    mu.lab = rd.str(*m, "lab", w, false).value_or("");
    if (!mu.lab.empty()) {
      const auto& known = lab::known_mutations();
      if (std::none_of(known.begin(), known.end(), [&](const lab::MutationInfo& k) { return mu.lab == k.name; })) {
        std::vector<std::string> names;
        for (const lab::MutationInfo& k : known) names.push_back(k.name);
        rd.error(rd.pos(*m, "lab"), w + ": unknown lab mutation '" + mu.lab + "' (known: " + quote_list(names) + ")");
      }
    }
    const std::string args = rd.str(*m, "args", w, false).value_or("");
    try {
      mu.args = commands::split_args(args);
    } catch (const lab::Error& e) {
      rd.error(rd.pos(*m, "args"), w + ": " + e.what());
    }
    if (mu.lab.empty() && mu.args.empty())
      rd.error(mu.pos, w + ": give lab (a lab mutation) or args (flags that break the claimed behaviour), or both");
    mu.runs = rd.strings(*m, "runs", w);
    mu.breaks = rd.strings(*m, "breaks", w);
    if (mu.breaks.empty() && m->get("breaks") == nullptr)
      rd.error(mu.pos, w + ": missing key 'breaks' (the ids of the checks that must fail)");
    for (const std::string& r : mu.runs)
      if (!l.find_run(r)) rd.error(rd.pos(*m, "runs"), w + ": no run '" + r + "'");
    for (const std::string& b : mu.breaks) {
      bool found = false;
      for (const Part* p : l.parts())
        for (const Check& c : p->checks) found = found || c.id == b;
      if (!found) rd.error(rd.pos(*m, "breaks"), w + ": no check '" + b + "'");
    }
    mu.timing = rd.boolean(*m, "timing", w).value_or(false);
    if (mu.timing) {  // only a check that reads a measured time can fail by the clock alone
      bool reads_time = false;
      for (const Part* p : l.parts())
        for (const Check& c : p->checks) {
          if (std::find(mu.breaks.begin(), mu.breaks.end(), c.id) == mu.breaks.end()) continue;
          for (const auto& [name, off] : c.that.names()) {
            const QuantitySpec* q = l.visible_quantity(*p, name);
            reads_time = reads_time || (q && is_timing_quantity(l, *p, *q));
          }
        }
      if (!reads_time)
        rd.error(rd.pos(*m, "timing"), w + ": no check it breaks reads a measured time: drop timing = true (it is "
                                           "judged on every machine)");
    }
    l.mutations.push_back(std::move(mu));
  }
}

}  // namespace

// ---- 5. load_lesson / parse_lesson ----

std::vector<const Part*> Lesson::parts() const {
  std::vector<const Part*> out = {&main};
  for (const Part& v : variations) out.push_back(&v);
  return out;
}

const RunSpec* Lesson::find_run(const std::string& name) const {
  for (const Part* p : parts())
    for (const RunSpec& r : p->runs)
      if (r.name == name) return &r;
  return nullptr;
}

std::vector<std::string> runs_read_by_checks(const Lesson& l, const std::vector<std::string>& check_ids) {
  std::set<std::string> runs;
  std::function<void(const std::string&)> add_run = [&](const std::string& name) {
    const RunSpec* r = l.find_run(name);
    if (!r || !runs.insert(name).second) return;
    for (const std::string& a : r->after) add_run(a);
  };
  for (const Part* p : l.parts()) {
    std::set<std::string> seen;  // quantity names followed, in this part's view
    std::function<void(const Expr&)> follow = [&](const Expr& e) {
      if (e.empty()) return;
      for (const auto& [name, offset] : e.names()) {
        if (!seen.insert(name).second) continue;
        const QuantitySpec* q = l.visible_quantity(*p, name);
        if (!q) continue;
        if (q->source == "expr") follow(q->expr);
        else add_run(q->run);
      }
    };
    for (const Check& c : p->checks) {
      if (std::find(check_ids.begin(), check_ids.end(), c.id) == check_ids.end()) continue;
      follow(c.that);
      if (c.timing) follow(c.quiet_if);
    }
  }
  std::vector<std::string> out;  // in the lesson's order, which runs what a run reads first
  for (const Part* p : l.parts())
    for (const RunSpec& r : p->runs)
      if (runs.count(r.name)) out.push_back(r.name);
  return out;
}

const QuantitySpec* Lesson::visible_quantity(const Part& p, const std::string& name) const {
  for (const QuantitySpec& q : p.quantities)
    if (q.name == name) return &q;
  if (&p != &main)
    for (const QuantitySpec& q : main.quantities)
      if (q.name == name) return &q;
  return nullptr;
}

const QuantitySpec* Lesson::find_quantity(const std::string& name) const {
  for (const Part* p : parts())
    for (const QuantitySpec& q : p->quantities)
      if (q.name == name) return &q;
  return nullptr;
}

Lesson parse_lesson(const std::string& text, const std::string& path) {
  Reader rd(path);
  toml::table t;
  try {
    t = lab::parse_toml(text, path);
  } catch (const toml::parse_error& e) {
    rd.error(pos_of(e.source()), "TOML: " + std::string(e.description()));
    throw LessonError(path, rd.diagnostics());
  }
  Lesson l;
  l.file = path;
  rd.known_keys(t, "the top level",
                {"format_version", "id", "version", "title", "question_source", "minutes", "budget_s", "requires", "tags",
                 "suite", "question", "predict", "runs", "quantities", "observe", "check", "hint", "explain", "variation",
                 "teacher", "torch_check", "mutation"});
  const std::string top = "the top level";
  l.format_version = static_cast<int>(rd.integer(t, "format_version", top, true).value_or(kLessonFormatVersion));
  if (t.get("format_version") && l.format_version != kLessonFormatVersion)
    rd.error(rd.pos(t, "format_version"), "format_version " + std::to_string(l.format_version) + " is not supported: this dtlab reads format_version " +
                                              std::to_string(kLessonFormatVersion));
  l.id = rd.str(t, "id", top, true).value_or("");
  if (!l.id.empty() && !std::regex_match(l.id, kIdPattern))
    rd.error(rd.pos(t, "id"), "id '" + l.id + "' must be lowercase letters, digits and '-' (it names the file: <id>.toml)");
  const std::string stem = std::filesystem::path(path).stem().string();
  if (!l.id.empty() && std::filesystem::path(path).extension() == ".toml" && stem != l.id)
    rd.error(rd.pos(t, "id"), "id '" + l.id + "' differs from the file name '" + stem + ".toml'");
  l.version = static_cast<int>(rd.integer(t, "version", top, true).value_or(1));
  l.title = rd.str(t, "title", top, true).value_or("");
  l.question_source = rd.str(t, "question_source", top, false).value_or("");
  l.minutes = rd.number(t, "minutes", top, true).value_or(0);
  l.budget_s = rd.number(t, "budget_s", top, true).value_or(0);
  if (t.get("budget_s") && !(l.budget_s > 0)) rd.error(rd.pos(t, "budget_s"), "budget_s must be > 0 (seconds its runs may take on 2 cores)");
  l.requires_ = rd.strings(t, "requires", top);
  for (const std::string& r : l.requires_) {
    const auto& known = known_requirements();
    if (std::find(known.begin(), known.end(), r) == known.end())
      rd.error(rd.pos(t, "requires"), "unknown requirement '" + r + "' (known: " + quote_list(known) + ")");
  }
  l.tags = rd.strings(t, "tags", top);
  l.suite = rd.str(t, "suite", top, false).value_or("lesson");
  if (l.suite != "lesson" && l.suite != "long")
    rd.error(rd.pos(t, "suite"), "suite must be \"lesson\" (the default: a few seconds on reduced data) or \"long\"");
  if (const toml::table* q = rd.table(t, "question", top, true)) {
    rd.known_keys(*q, "[question]", {"text", "context"});
    l.question = rd.str(*q, "text", "[question]", true).value_or("");
    l.context = rd.str(*q, "context", "[question]", false).value_or("");
  }
  l.main.id = "main";
  l.main.pos = {1, 1};
  read_part(rd, t, "the lesson", l.main);
  read_explain(rd, t, "the lesson", l.main, true);
  std::set<std::string> var_ids;
  for (const toml::table* v : rd.tables(t, "variation", top)) {
    Part p;
    p.pos = pos_of(v->source());
    rd.known_keys(*v, "[[variation]]", {"id", "title", "text", "predict", "runs", "quantities", "observe", "check", "hint", "explain"});
    p.id = rd.str(*v, "id", "[[variation]]", true).value_or("");
    if (!p.id.empty() && (!std::regex_match(p.id, kNamePattern) || p.id == "main"))
      rd.error(rd.pos(*v, "id"), "variation id '" + p.id + "' must be a name (letters, digits, _) other than 'main'");
    if (!p.id.empty() && !var_ids.insert(p.id).second) rd.error(rd.pos(*v, "id"), "variation id '" + p.id + "' appears twice");
    const std::string w = "variation '" + p.id + "'";
    p.title = rd.str(*v, "title", w, true).value_or("");
    p.text = rd.str(*v, "text", w, true).value_or("");
    read_part(rd, *v, w, p);
    read_explain(rd, *v, w, p, true);
    l.variations.push_back(std::move(p));
  }
  if (const toml::table* te = rd.table(t, "teacher", top, false)) {
    rd.known_keys(*te, "[teacher]", {"notes", "expected_first_vote", "pitfalls"});
    l.teacher.notes = rd.str(*te, "notes", "[teacher]", false).value_or("");
    l.teacher.expected_first_vote = rd.str(*te, "expected_first_vote", "[teacher]", false).value_or("");
    l.teacher.pitfalls = rd.strings(*te, "pitfalls", "[teacher]");
  }
  read_torch_checks_and_mutations(rd, t, l);
  Linker(rd, l).run();
  if (!rd.diagnostics().empty()) {
    auto& d = rd.diagnostics();
    std::stable_sort(d.begin(), d.end(), [](const Diagnostic& a, const Diagnostic& b) {
      return a.pos.line != b.pos.line ? a.pos.line < b.pos.line : a.pos.col < b.pos.col;
    });
    throw LessonError(path, d);
  }
  return l;
}

Lesson load_lesson(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw lab::IoError("cannot read lesson file " + path, "give a lesson id (dtlab lesson list) or a .toml file");
  std::stringstream s;
  s << f.rdbuf();
  return parse_lesson(s.str(), path);
}

// ---- 6. placeholders and number formats ----

std::vector<Placeholder> find_placeholders(const std::string& text) {
  std::vector<Placeholder> out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '{' && i + 1 < text.size() && text[i + 1] == '{') {
      ++i;
      continue;
    }
    if (text[i] == '}' && i + 1 < text.size() && text[i + 1] == '}') {
      ++i;
      continue;
    }
    if (text[i] != '{') continue;
    // the closing brace, outside quotes
    size_t j = i + 1;
    char quote = 0;
    for (; j < text.size(); ++j) {
      if (quote) {
        if (text[j] == '\\') ++j;
        else if (text[j] == quote) quote = 0;
      } else if (text[j] == '"' || text[j] == '\'') {
        quote = text[j];
      } else if (text[j] == '}') {
        break;
      }
    }
    if (j >= text.size()) throw ExprError("'{' without its '}' (write {{ for a literal brace)", static_cast<int>(i));
    const std::string inner = text.substr(i + 1, j - i - 1);
    // the format follows the last ':' outside quotes
    size_t colon = std::string::npos;
    quote = 0;
    for (size_t k = 0; k < inner.size(); ++k) {
      if (quote) {
        if (inner[k] == '\\') ++k;
        else if (inner[k] == quote) quote = 0;
      } else if (inner[k] == '"' || inner[k] == '\'') {
        quote = inner[k];
      } else if (inner[k] == ':') {
        colon = k;
      }
    }
    Placeholder ph;
    ph.begin = i;
    ph.end = j + 1;
    ph.format = colon == std::string::npos ? "" : inner.substr(colon + 1);
    const std::string expr = colon == std::string::npos ? inner : inner.substr(0, colon);
    try {
      ph.expr = Expr::parse(expr);
    } catch (const ExprError& e) {
      throw ExprError("in {" + inner + "}: " + e.what(), static_cast<int>(i + 1) + std::max(0, e.offset()));
    }
    if (!ph.format.empty() && !std::regex_match(ph.format, std::regex("^,?(\\.[0-9]{1,2})?[fegd%]?$")))
      throw ExprError("in {" + inner + "}: unknown format '" + ph.format + "' (use e.g. .3g, .2f, ,.0f, .1%, .2e, d)",
                      static_cast<int>(i + 1 + colon));
    out.push_back(std::move(ph));
    i = j;
  }
  return out;
}

namespace {

std::string with_commas(const std::string& s) {
  const size_t start = s[0] == '-' ? 1 : 0;
  size_t end = s.find_first_of(".eE");
  if (end == std::string::npos) end = s.size();
  std::string out = s.substr(0, start);
  for (size_t i = start; i < end; ++i) {
    out += s[i];
    const size_t left = end - i - 1;
    if (left > 0 && left % 3 == 0) out += ',';
  }
  return out + s.substr(end);
}

}  // namespace

std::string format_value(const Value& v, const std::string& format) {
  if (!v.is_number() || format.empty()) return v.to_string();
  const bool commas = !format.empty() && format[0] == ',';
  std::string f = commas ? format.substr(1) : format;
  char type = 'g';
  if (!f.empty() && std::string("fegd%").find(f.back()) != std::string::npos) {
    type = f.back();
    f.pop_back();
  }
  int precision = -1;
  if (!f.empty() && f[0] == '.') precision = std::stoi(f.substr(1));
  double x = v.number;
  char buf[64];
  if (type == 'd') {
    std::snprintf(buf, sizeof buf, "%.0f", std::round(x));
  } else if (type == '%') {
    std::snprintf(buf, sizeof buf, "%.*f%%", precision < 0 ? 6 : precision, x * 100.0);
  } else {
    const std::string spec = std::string("%.*") + type;
    std::snprintf(buf, sizeof buf, spec.c_str(), precision < 0 ? 6 : precision, x);
  }
  std::string s = buf;
  if (commas && std::isfinite(x)) s = with_commas(s);
  return s;
}

std::string reflow(const std::string& text) {
  std::string out, line;
  std::stringstream in(text);
  bool in_para = false;
  while (std::getline(in, line)) {
    const bool blank = line.find_first_not_of(" \t\r") == std::string::npos;
    if (blank) {
      if (!out.empty()) out += "\n\n";
      in_para = false;
      continue;
    }
    if (line.back() == '\r') line.pop_back();
    const bool own_line = line.rfind("- ", 0) == 0 || line.rfind("  ", 0) == 0;
    if (in_para && !own_line) out += " ";
    else if (in_para) out += "\n";
    out += own_line ? line : line.substr(line.find_first_not_of(' '));
    in_para = true;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// ---- 7. requirements and timing quantities ----

namespace {

// The last key of a JSON pointer that names a measured time, a rate or a ratio of times, in
// summary.json (dtlab run) and the result.json of dtlab bench and eval (commands/bench_*.h).
const std::set<std::string> kTimingKeys = {
    // summary.json
    "seconds", "train_seconds", "samples_per_s", "comm_seconds", "hidden_seconds", "hidden_fraction",
    "forward_seconds", "backward_seconds", "optimizer_seconds",
    // bench train, sgemm, chain, allreduce; eval
    "step_ms", "gflops", "ms_per_sample", "speedup_per_sample", "ratio_smallest_largest", "batched_ms",
    "per_sample_ms", "ratio", "time_ms", "scaling", "ratio_slowest_fastest", "time_us", "algbw_gbps", "busbw_gbps",
    "best_step_ms", "noise", "optimal_time_ms"};

std::string last_key(const std::string& pointer) {
  std::string key = pointer;
  for (;;) {
    const size_t slash = key.find_last_of('/');
    const std::string tail = slash == std::string::npos ? key : key.substr(slash + 1);
    if (tail.empty() || tail.find_first_not_of("0123456789") != std::string::npos || slash == std::string::npos) return tail;
    key = key.substr(0, slash);  // an array index: the key above it
  }
}

}  // namespace

namespace {

bool timing_quantity(const Lesson& l, const Part& p, const QuantitySpec& q, int depth) {
  if (q.source == "metrics") return q.path == "t";
  if (q.source == "trace") return true;  // the durations of timeline spans
  if (q.source == "summary" || q.source == "result") {
    // dtlab simulate computes its times (deterministic arithmetic): nothing in its result was timed
    const RunSpec* r = l.find_run(q.run);
    if (r && r->command == "simulate") return false;
    if (q.reduce == "count") return false;
    if (!q.field.empty()) return kTimingKeys.count(q.field.substr(q.field.find_last_of('.') + 1)) > 0;
    return kTimingKeys.count(last_key(q.path)) > 0;
  }
  if (q.source != "expr" || depth > 64) return false;  // deeper: a cycle, reported by the linker
  for (const auto& [name, off] : q.expr.names()) {
    const QuantitySpec* d = nullptr;
    for (const QuantitySpec& x : p.quantities)
      if (x.name == name) d = &x;
    if (!d)
      for (const QuantitySpec& x : l.main.quantities)
        if (x.name == name) d = &x;
    if (d && timing_quantity(l, p, *d, depth + 1)) return true;
  }
  return false;
}

}  // namespace

bool is_timing_quantity(const Lesson& l, const Part& p, const QuantitySpec& q) { return timing_quantity(l, p, q, 0); }

const std::vector<std::string>& known_requirements() {
  static const std::vector<std::string> k = {"mpi", "cuda", "full-dataset", "2-cores", "tuned-sgemm"};
  return k;
}

std::string missing_requirement(const std::string& what) {
  if (what == "mpi") {
    const auto t = lab::available_transports();
    if (std::find(t.begin(), t.end(), "mpi") == t.end())
      return "this build has no MPI transport (apt-get install openmpi-bin libopenmpi-dev, then rebuild)";
    if (std::system("command -v mpirun > /dev/null 2>&1") != 0) return "mpirun is not on PATH (apt-get install openmpi-bin)";
    return "";
  }
  if (what == "cuda") return "this build has no CUDA backend";
  if (what == "full-dataset") {
    const std::string f = std::string(lab::kDefaultDataDir) + "/train-images-idx3-ubyte.gz";
    std::error_code ec;
    if (!std::filesystem::exists(f, ec)) return "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
    return "";
  }
  if (what == "2-cores") return two_idle_cores_missing();  // measured now: machine.h
  // Claims about a matrix product's peak and its scaling on threads are claims about a tuned BLAS
  // (OpenBLAS); the reference sgemm (DTLAB_SGEMM=reference, or a build without BLAS) is neither.
  if (what == "tuned-sgemm") {
    const std::string name = lab::gemm_backend_name();
    if (name.rfind("openblas", 0) == 0) return "";
    return "this process computes matrix products with the " + name +
           " sgemm, not a tuned BLAS (unset DTLAB_SGEMM, or build with OpenBLAS)";
  }
  return "unknown requirement '" + what + "'";
}

}  // namespace lessons
