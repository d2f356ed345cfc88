// Session: one learner going through one lesson. It holds the predictions (locked once given),
// how each run ended, and, once a part's runs are done, what was measured: every quantity, which
// predictions were right, every check, the explanation with live numbers and the hints to show.
// The headless runner (dtlab lesson run) and the app's Lessons panel drive the same Session; the
// record it writes is what `dtlab lesson report` reads.
//
// Besides the lesson's own checks, a part passes only if
//   - every run ended as the lesson expects (exit code, error text): check "run:NAME";
//   - every choice prediction has exactly one choice whose predicate holds on the measurements
//     (none or two right would make the question unanswerable): check "prediction:ID";
//   - the explanation and the observe texts render (every placeholder has a value): "explain".
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "expr.h"
#include "lesson.h"
#include "quantity.h"

namespace lessons {

constexpr int kRecordFormatVersion = 1;
// Exit code of `dtlab lesson run` when a check fails (the lab no longer behaves as the lesson says).
constexpr int kExitLessonCheckFailed = 8;
// Exit code when a requirement (mpi, cuda, two idle cores, ...) is missing, or when a timing
// check could not be judged on a busy machine and none failed: ctest's skip code.
constexpr int kExitLessonSkipped = 77;

struct Answer {
  std::string value;   // a choice's key, or a number as typed
  int confidence = 0;  // 1 (guessing) .. 5 (sure); 0: not asked or not given
  std::string why;
  bool automatic = false;  // filled with the measured truth (--answers auto)
};

struct PredictionResult {
  const Prediction* prediction = nullptr;
  std::optional<Answer> answer;
  bool correct = false;
  std::vector<std::string> right_choices;  // choice: keys whose predicate holds
  std::optional<double> measured;          // numeric: the answer expression's value
  std::string error;                       // a rule that could not be evaluated
  std::string misconception;               // the chosen wrong choice's misconception, numbers filled in
  std::string truth() const;               // "b", "a, c", or the measured number with its unit
};

struct CheckResult {
  std::string id;
  std::string that;    // the expression, or what an implicit check requires
  std::string why;
  bool passed = false;
  std::string error;   // it could not be evaluated
  std::vector<std::pair<std::string, std::string>> values;  // the quantities it read, as text
  // A timing check (Check::timing) measured on a machine too busy to judge it: neither passed
  // nor failed; not_judged says why (its quiet_if was false, the second core was busy).
  bool judged = true;
  std::string not_judged;
};

struct PartResult {
  const Part* part = nullptr;
  std::vector<PredictionResult> predictions;
  std::vector<CheckResult> checks;           // implicit ones first, then the lesson's
  std::vector<std::pair<std::string, Value>> quantities;   // every visible quantity that could be read
  std::vector<std::pair<std::string, std::string>> quantity_errors;
  std::string explanation;                   // placeholders filled in
  std::vector<std::string> observations;     // each [[observe]] say, filled in
  std::vector<std::string> hints;            // for the wrong predictions, numbers filled in
  bool passed() const;        // no check failed (checks not judged do not fail)
  int failed_checks() const;
  int unjudged_checks() const;  // timing checks the machine was too busy to judge
};

class Session {
 public:
  Session(Lesson lesson, std::string out_dir);
  const Lesson& lesson() const { return m_lesson; }
  const std::string& out_dir() const { return m_out; }
  // Where run `name` writes: <out_dir>/<name>.
  std::string run_dir(const std::string& name) const { return m_out + "/" + name; }
  // The arguments a run executes with: {run:NAME} replaced by that run's directory, and where
  // it writes (--out DIR for run, --json DIR/result.json for bench and eval) added.
  std::vector<std::string> concrete_args(const RunSpec& r) const;

  // ---- predictions ----
  // Locks an answer. Throws lab::ConfigError for an unknown prediction, an unknown choice key, a
  // value that is not a number for a numeric prediction, a confidence outside 1..5, or a second
  // answer to the same prediction (answers are locked).
  void answer(const std::string& prediction, const std::string& value, int confidence = 0, const std::string& why = "");
  // Answers every open prediction with the measured truth when its part is evaluated (tests).
  void set_auto_answers(bool on) { m_auto = on; }
  bool auto_answers() const { return m_auto; }
  const Answer* answer_of(const std::string& prediction) const;
  bool answered(const Part& part) const;  // every prediction of the part (always, with auto)

  // ---- runs ----
  void set_outcome(RunOutcome o);
  const RunOutcome* outcome(const std::string& run) const;
  bool runs_done(const Part& part) const;

  // ---- results ----
  // Reads every quantity, judges the predictions, runs the checks, fills the texts. Needs every
  // run of the part to have an outcome (throws lab::Error otherwise). A timing check is judged
  // only when its quiet_if holds and, in a lesson that requires 2-cores, two cores are still idle
  // after the runs (measured here, when the part's runs were not prepared ahead: machine.h).
  const PartResult& evaluate(const Part& part);
  // Only the checks named (those of this part among ids), judged as evaluate() judges them; the
  // runs they read (runs_read_by_checks) must have outcomes, the part's other runs need not: a
  // check that reads a run not done ends with an error. For `dtlab lesson mutate`.
  std::vector<CheckResult> evaluate_checks(const Part& part, const std::vector<std::string>& ids);
  const PartResult* result(const Part& part) const;

  // A text's placeholders filled with what is known now (runs still to come give "…"): the
  // observe sentence while its run is paused mid-way.
  std::string render_now(const Part& part, const std::string& text);

  // The record of this session (lessons/README.md, "Records"): lesson id and version, dtlab's
  // version, who and when, every evaluated part's predictions with confidence, quantities, checks.
  nlohmann::json record(const std::string& front_end, const std::string& learner) const;

  // What evaluate() asks to learn whether two cores are still idle ("" when they are); by default
  // two_idle_cores_missing() (machine.h). Tests stand in a busy or an idle machine.
  void set_cores_check(std::function<std::string()> check) { m_cores_check = std::move(check); }

 private:
  std::string cores_busy_after(const Part& part) const;
  CheckResult judge(const Part& part, const Check& ck, std::optional<std::string>& busy, std::vector<std::string>& stack);
  const Value* lookup(const Part& part, const std::string& name, std::vector<std::string>& stack);
  Lesson m_lesson;
  std::string m_out;
  bool m_auto = false;
  std::map<std::string, Answer> m_answers;
  std::map<std::string, RunOutcome> m_outcomes;
  std::map<std::string, PartResult> m_results;  // by part id
  RunFiles m_files;
  std::map<std::string, Value> m_values;        // quantity values read so far
  std::map<std::string, std::string> m_errors;  // quantities that could not be read
  std::string m_started;                        // ISO time of the first answer
  std::function<std::string()> m_cores_check;
};

// The current time as ISO 8601 UTC ("2026-11-24T18:30:00Z").
std::string iso_now();

}  // namespace lessons
