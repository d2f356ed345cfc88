#include "session.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>

#include "command_line.h"
#include "config.h"
#include "errors.h"
#include "machine.h"

namespace lessons {

namespace {

// A quantity whose run has not run yet: not an error to remember, the value comes later.
class PendingError : public ExprError {
 public:
  using ExprError::ExprError;
};

}  // namespace

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string PredictionResult::truth() const {
  if (!prediction) return "";
  if (prediction->kind == "choice") {
    std::string out;
    for (const std::string& k : right_choices) out += (out.empty() ? "" : ", ") + k;
    return out.empty() ? "(none)" : out;
  }
  if (!measured) return "(not measured)";
  return format_value(Value::num(*measured), ".4g") + (prediction->unit.empty() ? "" : " " + prediction->unit);
}

bool PartResult::passed() const { return failed_checks() == 0; }

int PartResult::failed_checks() const {
  int n = 0;
  for (const CheckResult& c : checks) n += c.passed || !c.judged ? 0 : 1;
  return n;
}

int PartResult::unjudged_checks() const {
  int n = 0;
  for (const CheckResult& c : checks) n += c.judged ? 0 : 1;
  return n;
}

Session::Session(Lesson lesson, std::string out_dir) : m_lesson(std::move(lesson)), m_out(std::move(out_dir)) {}

std::vector<std::string> Session::concrete_args(const RunSpec& r) const {
  std::vector<std::string> out;
  for (std::string w : r.args) {
    for (size_t at = w.find("{run:"); at != std::string::npos; at = w.find("{run:", at)) {
      const size_t close = w.find('}', at);
      if (close == std::string::npos) break;
      const std::string dir = run_dir(w.substr(at + 5, close - at - 5));
      w.replace(at, close - at + 1, dir);
      at += dir.size();
    }
    out.push_back(w);
  }
  if (r.command == "run") {
    out.push_back("--out");
    out.push_back(run_dir(r.name));
  } else {
    out.push_back("--json");
    out.push_back(run_dir(r.name) + "/result.json");
  }
  return out;
}

// ---- predictions ----

namespace {

const Prediction* find_prediction(const Lesson& l, const std::string& id) {
  for (const Part* p : l.parts())
    for (const Prediction& pr : p->predictions)
      if (pr.id == id) return &pr;
  return nullptr;
}

bool parse_number(const std::string& s, double& out) {
  try {
    size_t used = 0;
    out = std::stod(s, &used);
    while (used < s.size() && s[used] == ' ') ++used;
    return used == s.size() && std::isfinite(out);
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

void Session::answer(const std::string& prediction, const std::string& value, int confidence, const std::string& why) {
  const Prediction* p = find_prediction(m_lesson, prediction);
  if (!p) {
    std::string ids;
    for (const Part* part : m_lesson.parts())
      for (const Prediction& pr : part->predictions) ids += (ids.empty() ? "" : ", ") + pr.id;
    throw lab::ConfigError("lesson " + m_lesson.id + " has no prediction '" + prediction + "' (its predictions: " + ids + ")");
  }
  if (m_answers.count(prediction))
    throw lab::ConfigError("prediction '" + prediction + "' is already answered (" + m_answers[prediction].value +
                           "): answers are locked once given");
  if (confidence < 0 || confidence > 5) throw lab::ConfigError("confidence must be 1 (guessing) to 5 (sure), got " + std::to_string(confidence));
  if (p->kind == "choice") {
    std::string keys;
    bool found = false;
    for (const Choice& c : p->choices) {
      keys += (keys.empty() ? "" : ", ") + c.key;
      found |= c.key == value;
    }
    if (!found) throw lab::ConfigError("prediction '" + prediction + "': '" + value + "' is not a choice (choose " + keys + ")");
  } else {
    double x = 0;
    if (!parse_number(value, x))
      throw lab::ConfigError("prediction '" + prediction + "': '" + value + "' is not a number" +
                             (p->unit.empty() ? "" : " (in " + p->unit + ")"));
  }
  if (m_started.empty()) m_started = iso_now();
  m_answers[prediction] = Answer{value, confidence, why, false};
}

const Answer* Session::answer_of(const std::string& prediction) const {
  auto it = m_answers.find(prediction);
  return it == m_answers.end() ? nullptr : &it->second;
}

bool Session::answered(const Part& part) const {
  if (m_auto) return true;
  for (const Prediction& p : part.predictions)
    if (!m_answers.count(p.id)) return false;
  return true;
}

// ---- runs ----

void Session::set_outcome(RunOutcome o) {
  const std::string name = o.name;
  m_outcomes[name] = std::move(o);
}

const RunOutcome* Session::outcome(const std::string& run) const {
  auto it = m_outcomes.find(run);
  return it == m_outcomes.end() ? nullptr : &it->second;
}

bool Session::runs_done(const Part& part) const {
  for (const RunSpec& r : part.runs)
    if (!m_outcomes.count(r.name)) return false;
  return true;
}

// ---- results ----

const Value* Session::lookup(const Part& part, const std::string& name, std::vector<std::string>& stack) {
  auto v = m_values.find(name);
  if (v != m_values.end()) return &v->second;
  auto e = m_errors.find(name);
  if (e != m_errors.end()) throw ExprError("quantity '" + name + "' could not be read: " + e->second);
  const QuantitySpec* q = m_lesson.visible_quantity(part, name);
  if (!q) return nullptr;
  if (std::find(stack.begin(), stack.end(), name) != stack.end()) throw ExprError("quantity '" + name + "' depends on itself");
  try {
    Value val;
    if (q->source == "expr") {
      stack.push_back(name);
      val = q->expr.eval([&](const std::string& n) { return lookup(part, n, stack); });
      stack.pop_back();
    } else {
      const RunOutcome* o = outcome(q->run);
      if (!o) throw PendingError("run '" + q->run + "' has not run yet");
      val = m_files.read(*q, *o);
    }
    return &(m_values[name] = std::move(val));
  } catch (const PendingError&) {
    if (!stack.empty() && stack.back() == name) stack.pop_back();
    throw;
  } catch (const std::exception& ex) {
    if (!stack.empty() && stack.back() == name) stack.pop_back();
    m_errors[name] = ex.what();
    throw ExprError("quantity '" + name + "' could not be read: " + ex.what());
  }
}

namespace {

// The values an expression read, for printing next to a check.
std::vector<std::pair<std::string, std::string>> values_of(const Expr& e, const std::function<const Value*(const std::string&)>& get) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, off] : e.names()) {
    try {
      const Value* v = get(name);
      out.emplace_back(name, v ? v->to_string() : "(unknown)");
    } catch (const std::exception& ex) {
      out.emplace_back(name, "(not read)");
    }
  }
  return out;
}

std::string render(const std::string& text, const std::function<const Value*(const std::string&)>& get, std::string& error) {
  std::string out;
  size_t last = 0;
  std::vector<Placeholder> phs;
  try {
    phs = find_placeholders(text);
  } catch (const ExprError& e) {
    error = e.what();
    return text;
  }
  for (const Placeholder& ph : phs) {
    out += text.substr(last, ph.begin - last);
    try {
      out += format_value(ph.expr.eval(get), ph.format);
    } catch (const ExprError& e) {
      if (error.empty()) error = "{" + ph.expr.text() + "}: " + e.what();
      out += "{?}";
    }
    last = ph.end;
  }
  out += text.substr(last);
  // literal braces
  std::string final;
  for (size_t i = 0; i < out.size(); ++i) {
    final += out[i];
    if ((out[i] == '{' || out[i] == '}') && i + 1 < out.size() && out[i + 1] == out[i]) ++i;
  }
  return final;
}

}  // namespace

std::string Session::cores_busy_after(const Part& part) const {
  if (std::find(m_lesson.requires_.begin(), m_lesson.requires_.end(), "2-cores") == m_lesson.requires_.end()) return "";
  // prepared runs were timed when they were prepared (on a machine that then had two idle cores)
  for (const RunSpec& r : part.runs)
    if (const RunOutcome* o = outcome(r.name); o && o->prepared) return "";
  return m_cores_check ? m_cores_check() : two_idle_cores_missing();
}

CheckResult Session::judge(const Part& part, const Check& ck, std::optional<std::string>& busy, std::vector<std::string>& stack) {
  auto get = [&](const std::string& n) -> const Value* { return lookup(part, n, stack); };
  CheckResult c;
  c.id = ck.id;
  c.that = ck.that.text();
  c.why = ck.why;
  if (ck.timing) {
    if (!busy) busy = cores_busy_after(part);
    if (!busy->empty()) {
      c.judged = false;
      c.not_judged = "not judged: when the runs ended, " + *busy;
    } else {
      try {
        if (!ck.quiet_if.eval_bool(get))
          c.not_judged = "not judged: too noisy, quiet_if (" + ck.quiet_if.text() + ") is false";
      } catch (const ExprError& e) {
        c.not_judged = std::string("not judged: quiet_if could not be evaluated: ") + e.what();
      }
      c.judged = c.not_judged.empty();
      if (!c.judged) {
        std::string vals;
        for (const auto& [k, v] : values_of(ck.quiet_if, get)) vals += (vals.empty() ? "" : ", ") + k + "=" + v;
        if (!vals.empty()) c.not_judged += " (" + vals + ")";
      }
    }
  }
  try {
    c.passed = ck.that.eval_bool(get);
  } catch (const ExprError& e) {
    c.error = e.what();
    c.passed = false;
  }
  c.values = values_of(ck.that, get);
  return c;
}

std::vector<CheckResult> Session::evaluate_checks(const Part& part, const std::vector<std::string>& ids) {
  std::vector<CheckResult> out;
  std::optional<std::string> busy;
  std::vector<std::string> stack;
  for (const Check& ck : part.checks)
    if (std::find(ids.begin(), ids.end(), ck.id) != ids.end()) out.push_back(judge(part, ck, busy, stack));
  return out;
}

const PartResult& Session::evaluate(const Part& part) {
  for (const RunSpec& r : part.runs)
    if (!m_outcomes.count(r.name)) throw lab::Error("lesson " + m_lesson.id + ": run '" + r.name + "' has not run yet");
  PartResult res;
  res.part = &part;
  std::vector<std::string> stack;
  auto get = [&](const std::string& n) -> const Value* { return lookup(part, n, stack); };

  // how each run ended
  for (const RunSpec& r : part.runs) {
    const RunOutcome& o = m_outcomes.at(r.name);
    CheckResult c;
    c.id = "run:" + r.name;
    c.that = r.expect_exit == 0 ? "exits with 0" : "exits with " + std::to_string(r.expect_exit) +
                                                      (r.expect_error.empty() ? "" : " and the error says \"" + r.expect_error + "\"");
    c.why = "run '" + r.name + "' ends as the lesson expects: " + o.command_line();
    c.values = {{"exit_code", std::to_string(o.exit_code)}};
    if (!o.error.empty()) c.values.push_back({"error", o.error.substr(0, o.error.find('\n'))});
    c.passed = o.exit_code == r.expect_exit && (r.expect_error.empty() || o.error.find(r.expect_error) != std::string::npos);
    if (!c.passed && o.exit_code != r.expect_exit && o.exit_code != 0)
      c.error = "it failed: " + o.error + (o.hint.empty() ? "" : " (hint: " + o.hint + ")");
    res.checks.push_back(std::move(c));
  }

  // predictions
  for (const Prediction& p : part.predictions) {
    PredictionResult pr;
    pr.prediction = &p;
    CheckResult c;
    c.id = "prediction:" + p.id;
    c.why = "the measurements decide prediction '" + p.id + "'";
    try {
      if (p.kind == "choice") {
        c.that = "exactly one choice's correct_if holds";
        for (const Choice& ch : p.choices) {
          const bool holds = ch.correct_if.eval_bool(get);
          c.values.push_back({ch.key, holds ? "true" : "false"});
          if (holds) pr.right_choices.push_back(ch.key);
        }
        c.passed = pr.right_choices.size() == 1;
        if (pr.right_choices.empty()) c.error = "no choice is right by the measurements";
        else if (pr.right_choices.size() > 1) c.error = "several choices are right by the measurements: " + pr.truth();
      } else {
        c.that = "the answer " + p.answer.text() + " is a number";
        pr.measured = p.answer.eval_number(get);
        c.values.push_back({"answer", format_value(Value::num(*pr.measured), ".6g")});
        c.passed = std::isfinite(*pr.measured);
        if (!c.passed) c.error = "the measured answer is not finite";
      }
    } catch (const ExprError& e) {
      pr.error = e.what();
      c.error = e.what();
      c.passed = false;
    }
    if (m_auto && !m_answers.count(p.id) && pr.error.empty()) {
      Answer a;
      a.automatic = true;
      a.value = p.kind == "choice" ? (pr.right_choices.empty() ? "" : pr.right_choices.front())
                                   : format_value(Value::num(*pr.measured), ".6g");
      m_answers[p.id] = a;
    }
    if (const Answer* a = answer_of(p.id)) {
      pr.answer = *a;
      if (p.kind == "choice") {
        pr.correct = std::find(pr.right_choices.begin(), pr.right_choices.end(), a->value) != pr.right_choices.end();
      } else if (pr.measured) {
        double guess = 0;
        parse_number(a->value, guess);
        pr.correct = std::fabs(guess - *pr.measured) <= p.atol + p.rtol * std::fabs(*pr.measured);
      }
    }
    if (pr.answer && !pr.correct) {
      std::string ignored;  // a placeholder that cannot be filled shows as {?}; the explain check reports texts
      for (const Hint& h : part.hints) {
        if (!h.prediction.empty() && h.prediction != p.id) continue;
        const std::string text = render(h.text, get, ignored);
        if (std::find(res.hints.begin(), res.hints.end(), text) == res.hints.end()) res.hints.push_back(text);
      }
      for (const Choice& ch : p.choices)
        if (ch.key == pr.answer->value && !ch.misconception.empty()) pr.misconception = render(ch.misconception, get, ignored);
    }
    res.predictions.push_back(std::move(pr));
    res.checks.push_back(std::move(c));
  }

  // texts
  {
    CheckResult c;
    c.id = "explain";
    c.that = "every {placeholder} of the explanation and the observe texts has a value";
    c.why = "the explanation's numbers come from the runs";
    std::string error;
    res.explanation = render(part.explain, get, error);
    for (const Observe& o : part.observe) res.observations.push_back(render(o.say, get, error));
    c.passed = error.empty();
    c.error = error;
    res.checks.push_back(std::move(c));
  }

  // the lesson's checks; a timing claim only where the machine was quiet enough to judge it
  std::optional<std::string> busy;  // why two cores were not idle after the runs ("": they were)
  for (const Check& ck : part.checks) res.checks.push_back(judge(part, ck, busy, stack));

  // every visible quantity, for the record and the app
  std::vector<const QuantitySpec*> visible;
  for (const QuantitySpec& q : part.quantities) visible.push_back(&q);
  if (&part != &m_lesson.main)
    for (const QuantitySpec& q : m_lesson.main.quantities) visible.push_back(&q);
  for (const QuantitySpec* q : visible) {
    try {
      if (const Value* v = get(q->name)) res.quantities.emplace_back(q->name, *v);
    } catch (const ExprError&) {
      res.quantity_errors.emplace_back(q->name, m_errors.count(q->name) ? m_errors[q->name] : "not read");
    }
  }
  return m_results[part.id] = std::move(res);
}

std::string Session::render_now(const Part& part, const std::string& text) {
  std::vector<std::string> stack;
  std::string error;
  const std::string out = render(text, [&](const std::string& n) { return lookup(part, n, stack); }, error);
  // "{?}" marks a value still to come
  std::string shown;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out.compare(i, 3, "{?}") == 0) {
      shown += "\u2026";
      i += 2;
    } else {
      shown += out[i];
    }
  }
  return shown;
}

const PartResult* Session::result(const Part& part) const {
  auto it = m_results.find(part.id);
  return it == m_results.end() ? nullptr : &it->second;
}

// ---- the record ----

namespace {

nlohmann::json value_json(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Number:
      return std::isfinite(v.number) ? nlohmann::json(v.number) : nlohmann::json(v.to_string());
    case Value::Kind::Bool: return v.boolean;
    case Value::Kind::String: return v.text;
    case Value::Kind::Tensor: {
      // small tensors whole; large ones summarized (a record stays a few kilobytes)
      if (v.tensor.size() <= 16) {
        nlohmann::json a = nlohmann::json::array();
        for (double x : v.tensor) a.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr));
        return a;
      }
      double mn = v.tensor[0], mx = v.tensor[0], sum = 0;
      for (double x : v.tensor) {
        mn = std::min(mn, x);
        mx = std::max(mx, x);
        sum += x;
      }
      return {{"tensor_values", v.tensor.size()}, {"min", mn}, {"max", mx}, {"mean", sum / static_cast<double>(v.tensor.size())}};
    }
  }
  return nullptr;
}

}  // namespace

nlohmann::json Session::record(const std::string& front_end, const std::string& learner) const {
  nlohmann::json parts = nlohmann::json::array();
  bool all_passed = true;
  for (const Part* p : m_lesson.parts()) {
    const PartResult* r = result(*p);
    if (!r) continue;
    all_passed &= r->passed();
    nlohmann::json preds = nlohmann::json::array();
    for (const PredictionResult& pr : r->predictions) {
      nlohmann::json j = {{"id", pr.prediction->id}, {"kind", pr.prediction->kind}, {"prompt", pr.prediction->prompt},
                          {"correct", pr.correct}, {"truth", pr.truth()}};
      if (pr.answer) {
        j["answer"] = pr.answer->value;
        j["confidence"] = pr.answer->confidence;
        j["why"] = pr.answer->why;
        j["automatic"] = pr.answer->automatic;
      } else {
        j["answer"] = nullptr;
      }
      if (pr.prediction->kind == "choice") {
        j["right_choices"] = pr.right_choices;
        nlohmann::json choices = nlohmann::json::array();
        for (const Choice& c : pr.prediction->choices) choices.push_back({{"key", c.key}, {"text", c.text}});
        j["choices"] = choices;
      } else {
        j["measured"] = pr.measured ? nlohmann::json(*pr.measured) : nlohmann::json(nullptr);
        j["unit"] = pr.prediction->unit;
        j["rtol"] = pr.prediction->rtol;
        j["atol"] = pr.prediction->atol;
      }
      if (!pr.error.empty()) j["error"] = pr.error;
      preds.push_back(j);
    }
    nlohmann::json checks = nlohmann::json::array();
    for (const CheckResult& c : r->checks) {
      nlohmann::json vals = nlohmann::json::object();
      for (const auto& [k, v] : c.values) vals[k] = v;
      nlohmann::json j = {{"id", c.id}, {"that", c.that}, {"why", c.why}, {"passed", c.passed}, {"values", vals}};
      if (!c.error.empty()) j["error"] = c.error;
      if (!c.judged) {
        j["judged"] = false;  // a timing check the machine was too busy to judge: passed says nothing
        j["not_judged"] = c.not_judged;
      }
      checks.push_back(j);
    }
    nlohmann::json qs = nlohmann::json::object();
    for (const auto& [k, v] : r->quantities) qs[k] = value_json(v);
    for (const auto& [k, e] : r->quantity_errors) qs[k] = {{"error", e}};
    nlohmann::json runs = nlohmann::json::array();
    for (const RunSpec& rs : p->runs)
      if (const RunOutcome* o = outcome(rs.name)) {
        nlohmann::json j = o->to_json();
        j.erase("format");
        j.erase("format_version");
        j["dir"] = o->dir;
        j["prepared"] = o->prepared;
        runs.push_back(j);
      }
    parts.push_back({{"part", p->id}, {"title", p->id == "main" ? m_lesson.title : p->title}, {"predictions", preds},
                     {"checks", checks}, {"passed", r->passed()}, {"not_judged", r->unjudged_checks()},
                     {"quantities", qs}, {"runs", runs}});
  }
  return {{"format", "dtlab-lesson-record"},
          {"format_version", kRecordFormatVersion},
          {"dtlab_version", lab::kDtlabVersion},
          {"lesson", {{"id", m_lesson.id}, {"version", m_lesson.version}, {"title", m_lesson.title}, {"file", m_lesson.file}}},
          {"learner", learner},
          {"front_end", front_end},
          {"answers", m_auto ? "auto" : "learner"},
          {"started", m_started.empty() ? iso_now() : m_started},
          {"finished", iso_now()},
          {"out_dir", m_out},
          {"passed", all_passed},
          {"parts", parts}};
}

}  // namespace lessons
