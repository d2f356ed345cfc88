// dtlab lesson: sections
//   1. text helpers (wrapping, answers from flags)
//   2. list, show, check
//   3. run: predictions, runs, results
//   4. report, prepare
//   5. torch-check, mutate: the lesson's claims against PyTorch and against a wrong lab
//   6. the command line
#include "lesson_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "bench_rounds.h"
#include "catalog.h"
#include "command_line.h"
#include "errors.h"
#include "lesson.h"
#include "lesson_runs.h"
#include "report.h"
#include "session.h"

namespace fs = std::filesystem;
using namespace lessons;

namespace {

// ---- 1. text helpers ----

// Wraps text to `width` columns, every line starting with `indent`; blank lines separate
// paragraphs, and lines that start with "- " or spaces keep their own breaks.
std::string wrap(const std::string& text, const std::string& indent, size_t width = 100) {
  std::string out;
  std::stringstream in(text);
  std::string line;
  std::string para;
  auto flush = [&] {
    if (para.empty()) return;
    std::stringstream words(para);
    std::string w, cur = indent;
    while (words >> w) {
      if (cur.size() > indent.size() && cur.size() + 1 + w.size() > width) {
        out += cur + "\n";
        cur = indent;
      }
      cur += (cur.size() > indent.size() ? " " : "") + w;
    }
    out += cur + "\n";
    para.clear();
  };
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t") == std::string::npos) {
      flush();
      out += "\n";
    } else if (line.rfind("  ", 0) == 0) {
      flush();
      out += indent + line + "\n";
    } else if (line.rfind("- ", 0) == 0) {
      // a list item: wrapped with a hanging indent
      flush();
      const std::string item = wrap(line.substr(2), indent + "  ", width);
      out += indent + "- " + item.substr(indent.size() + 2);
    } else {
      para += (para.empty() ? "" : " ") + line;
    }
  }
  flush();
  while (out.size() >= 2 && out.compare(out.size() - 2, 2, "\n\n") == 0) out.pop_back();
  return out;
}

// "label text" with the text wrapped under itself: "    a) first line\n       second line".
std::string item(const std::string& label, const std::string& text, const std::string& indent) {
  const std::string hang(indent.size() + label.size() + 1, ' ');
  const std::string body = wrap(text, hang);
  return indent + label + " " + body.substr(std::min(hang.size(), body.size()));
}

std::map<std::string, std::string> parse_pairs(const std::string& text, const std::string& flag) {
  std::map<std::string, std::string> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw lab::ConfigError(flag + ": expected KEY=VALUE pairs separated by commas, got '" + item + "'",
                             "e.g. " + flag + " whose_batch=a,bytes=1.5");
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

const char* kRule = "----------------------------------------------------------------------------------------------------";

void heading(const std::string& title) { std::printf("\n%s\n%.*s\n", title.c_str(), static_cast<int>(std::min<size_t>(title.size(), 100)), kRule); }

void print_question(const Lesson& l) {
  std::printf("Lesson %s (v%d): %s  [~%g min]\n", l.id.c_str(), l.version, l.title.c_str(), l.minutes);
  if (!l.question_source.empty()) std::printf("%s", wrap("Asked in: " + l.question_source, "  ").c_str());
  heading("Question");
  std::printf("%s", wrap(l.question, "  ").c_str());
  if (!l.context.empty()) std::printf("\n%s", wrap(l.context, "  ").c_str());
}

void print_prediction(const Prediction& p) {
  std::printf("\n%s", wrap("Predict [" + p.id + "]: " + p.prompt, "  ").c_str());
  if (p.kind == "choice")
    for (const Choice& c : p.choices) std::printf("%s", item(c.key + ")", c.text, "    ").c_str());
  else
    std::printf("    (a number%s)\n", p.unit.empty() ? "" : (" in " + p.unit).c_str());
}

// ---- 2. list, show, check ----

int cmd_list() {
  const std::vector<CatalogEntry> cat = load_catalog();
  if (cat.empty()) {
    std::printf("no lessons found (lesson directories: ");
    for (const std::string& d : lesson_dirs()) std::printf("%s ", d.c_str());
    std::printf("); set DTLAB_LESSONS to a folder of .toml lessons\n");
    return lab::kExitOk;
  }
  std::printf("%-22s %-7s %-12s %s\n", "id", "minutes", "requires", "title");
  int broken = 0;
  for (const CatalogEntry& c : cat) {
    if (!c.lesson) {
      ++broken;
      const std::string first = c.error.substr(0, c.error.find('\n'));
      std::printf("%-22s %-7s %-12s (cannot be used: %s)\n", c.id.c_str(), "-", "-", first.c_str());
      continue;
    }
    std::string req;
    for (const std::string& r : c.lesson->requires_) req += (req.empty() ? "" : ",") + r;
    std::printf("%-22s %-7g %-12s %s\n", c.id.c_str(), c.lesson->minutes, req.empty() ? "-" : req.c_str(), c.lesson->title.c_str());
  }
  std::printf("\n%zu lessons%s. Start one: dtlab lesson run ID (headless) or dtlab gui --lesson ID\n", cat.size() - broken,
              broken ? (", " + std::to_string(broken) + " with problems (dtlab lesson check)").c_str() : "");
  return lab::kExitOk;
}

int cmd_show(const LessonCommandOptions& o) {
  const Lesson l = load_lesson(resolve_lesson(o.lesson));
  print_question(l);
  heading("Predictions (answer them before anything runs)");
  for (const Prediction& p : l.main.predictions) print_prediction(p);
  for (const Part& v : l.variations) {
    std::printf("\n  Then, variation %s: %s\n", v.id.c_str(), v.title.c_str());
    for (const Prediction& p : v.predictions) print_prediction(p);
  }
  std::string req;
  for (const std::string& r : l.requires_) req += (req.empty() ? "" : ", ") + r;
  size_t runs = 0;
  for (const Part* p : l.parts()) runs += p->runs.size();
  std::printf("\n%zu run%s (the lesson and its variations), within %g s on 2 cores%s. Start: dtlab lesson run %s  or  "
              "dtlab gui --lesson %s\n",
              runs, runs == 1 ? "" : "s", l.budget_s, req.empty() ? "" : ("; requires " + req).c_str(), l.id.c_str(),
              l.id.c_str());
  if (o.teacher && (!l.teacher.notes.empty() || !l.teacher.pitfalls.empty())) {
    heading("Teacher notes");
    std::printf("%s", wrap(l.teacher.notes, "  ").c_str());
    if (!l.teacher.expected_first_vote.empty()) std::printf("%s", wrap("Expected first vote: " + l.teacher.expected_first_vote, "  ").c_str());
    for (const std::string& p : l.teacher.pitfalls) std::printf("%s", wrap("- " + p, "  ").c_str());
  }
  return lab::kExitOk;
}

int cmd_check(const LessonCommandOptions& o) {
  std::vector<std::string> files = o.files;
  if (files.empty())
    for (const CatalogEntry& c : load_catalog()) files.push_back(c.path);
  if (files.empty()) throw lab::ConfigError("dtlab lesson check: no lesson files given or found", "dtlab lesson check FILE.toml");
  int bad = 0;
  for (const std::string& f : files) {
    try {
      const Lesson l = load_lesson(f);
      size_t runs = 0, checks = 0;
      for (const Part* p : l.parts()) {
        runs += p->runs.size();
        checks += p->checks.size();
      }
      std::printf("%s: ok (%s: %zu runs, %zu checks, %zu variation%s)\n", f.c_str(), l.id.c_str(), runs, checks,
                  l.variations.size(), l.variations.size() == 1 ? "" : "s");
    } catch (const LessonError& e) {
      ++bad;
      for (const Diagnostic& d : e.diagnostics()) std::fprintf(stderr, "%s\n", d.format().c_str());
    } catch (const lab::Error& e) {
      ++bad;
      std::fprintf(stderr, "%s\n", e.what());
    }
  }
  if (bad) std::fprintf(stderr, "%d of %zu lesson file%s with problems\n", bad, files.size(), files.size() == 1 ? "" : "s");
  return bad ? lab::kExitUsage : lab::kExitOk;
}

// ---- 3. run ----

// Asks for one prediction on the terminal until the answer is valid; locks it.
void ask(Session& s, const Prediction& p) {
  print_prediction(p);
  for (;;) {
    std::string keys;
    for (const Choice& c : p.choices) keys += (keys.empty() ? "" : "/") + c.key;
    std::printf("  Your answer%s: ", p.kind == "choice" ? (" (" + keys + ")").c_str() : (p.unit.empty() ? "" : (" in " + p.unit).c_str()));
    std::fflush(stdout);
    std::string a;
    if (!std::getline(std::cin, a)) throw lab::ConfigError("no answer for prediction '" + p.id + "' (end of input)", "pass --answers");
    a.erase(0, a.find_first_not_of(" \t"));
    a.erase(a.find_last_not_of(" \t\r") + 1);
    int conf = 0;
    std::string why;
    while (p.confidence) {
      std::printf("  How sure are you? 1 (guessing) .. 5 (sure), or Enter to skip: ");
      std::fflush(stdout);
      std::string c;
      if (!std::getline(std::cin, c) || c.find_first_not_of(" \t\r") == std::string::npos) break;
      char* end = nullptr;
      const long v = std::strtol(c.c_str(), &end, 10);
      if (end && *end == 0 && v >= 1 && v <= 5) {
        conf = static_cast<int>(v);
        break;
      }
      std::printf("  '%s' is not a number from 1 to 5\n", c.c_str());
    }
    if (p.ask_why) {
      std::printf("  Why, in one line: ");
      std::fflush(stdout);
      std::getline(std::cin, why);
    }
    try {
      s.answer(p.id, a, conf, why);
      std::printf("  Locked: %s%s\n", a.c_str(), conf ? (" (confidence " + std::to_string(conf) + ")").c_str() : "");
      return;
    } catch (const lab::ConfigError& e) {
      std::printf("  %s\n", e.what());
    }
  }
}

// Answers from --answers / --confidence for the predictions of `parts`; what is missing is asked
// on a terminal, or is an error without one.
void collect_answers(Session& s, const std::vector<const Part*>& parts, const LessonCommandOptions& o, bool& asked) {
  if (o.answers == "auto") {
    s.set_auto_answers(true);
    return;
  }
  const auto answers = parse_pairs(o.answers, "--answers");
  const auto conf = parse_pairs(o.confidence, "--confidence");
  const auto why = parse_pairs(o.why, "--why");
  for (const auto& [k, v] : conf)
    if (!answers.count(k)) throw lab::ConfigError("--confidence " + k + "=" + v + ": no answer for '" + k + "' in --answers");
  for (const auto& [k, v] : why)
    if (!answers.count(k)) throw lab::ConfigError("--why " + k + "=...: no answer for '" + k + "' in --answers");
  for (const auto& [k, v] : answers) {
    int level = 0;
    if (const auto c = conf.find(k); c != conf.end()) {
      char* end = nullptr;
      const long x = std::strtol(c->second.c_str(), &end, 10);
      if (!end || *end != 0 || x < 1 || x > 5)
        throw lab::ConfigError("--confidence " + k + "=" + c->second + ": a number from 1 (guessing) to 5 (sure)");
      level = static_cast<int>(x);
    }
    const auto w = why.find(k);
    s.answer(k, v, level, w == why.end() ? "" : w->second);
  }
  std::vector<std::string> missing;
  for (const Part* p : parts)
    for (const Prediction& pr : p->predictions)
      if (!s.answer_of(pr.id)) missing.push_back(pr.id);
  if (missing.empty()) return;
  if (!isatty(STDIN_FILENO)) {
    std::string m;
    for (const std::string& x : missing) m += (m.empty() ? "" : ", ") + x;
    throw lab::ConfigError("no answer for prediction" + std::string(missing.size() > 1 ? "s " : " ") + m +
                               " (standard input is not a terminal)",
                           "pass --answers " + missing[0] + "=...,... (dtlab lesson show " + s.lesson().id +
                               " lists the choices), or --answers auto for a test run");
  }
  asked = true;
}

class RunProgress {
 public:
  RunProgress(size_t index, size_t count, const RunSpec& r, const std::string& line)
      : m_tty(isatty(STDOUT_FILENO)), m_prefix("  [" + std::to_string(index) + "/" + std::to_string(count) + "] " + r.name) {
    std::printf("%s%s\n", m_prefix.c_str(), m_tty ? "" : "");
    std::printf("%s", wrap(line, "        $ ", 200).c_str());
    std::fflush(stdout);
  }
  void tick(const lab::Snapshot& s) {
    if (!m_tty || s.latest.empty() || s.steps_total <= 0) return;
    const int64_t done = s.latest[0].batch_size ? s.latest[0].step + 1 : 0;
    const int width = 30;
    const int fill = static_cast<int>(width * std::min<int64_t>(done, s.steps_total) / s.steps_total);
    std::string bar(static_cast<size_t>(fill), '#');
    bar.resize(width, '.');
    std::printf("\r\033[K        [%s] step %lld/%lld", bar.c_str(), static_cast<long long>(done), static_cast<long long>(s.steps_total));
    std::fflush(stdout);
  }
  void done(const RunOutcome& o) {
    if (m_tty) std::printf("\r\033[K");
    if (o.exit_code == 0) std::printf("        ok in %.1f s%s\n", o.seconds, o.prepared ? " (prepared)" : "");
    else std::printf("        exit %d in %.1f s%s: %s\n", o.exit_code, o.seconds, o.prepared ? " (prepared)" : "", o.error.substr(0, o.error.find('\n')).c_str());
    std::fflush(stdout);
  }

 private:
  bool m_tty;
  std::string m_prefix;
};

// Runs (or replays) every run of the part, or only those named in `only` when it is given.
void run_part(Session& s, const Part& part, const std::string& prepared, const std::vector<std::string>* only = nullptr) {
  size_t i = 0;
  for (const RunSpec& r : part.runs) {
    ++i;
    if (only && std::find(only->begin(), only->end(), r.name) == only->end()) continue;
    const std::vector<std::string> args = s.concrete_args(r);
    if (!prepared.empty()) {
      RunOutcome o = read_outcome(prepared + "/" + r.name);
      if (o.args != args || o.command != r.command)
        throw lab::ConfigError("the prepared run '" + r.name + "' in " + prepared + " was made for another version of the lesson (" +
                                   o.command_line() + ")",
                               "prepare it again: dtlab lesson prepare " + s.lesson().id);
      o.prepared = true;
      RunProgress p(i, part.runs.size(), r, o.command_line());
      p.done(o);
      s.set_outcome(std::move(o));
      continue;
    }
    RunProgress p(i, part.runs.size(), r, commands::command_line(r.command, args));
    ExecHooks hooks;
    hooks.on_progress = [&](const lab::Snapshot& snap) { p.tick(snap); };
    RunOutcome o = execute_run(r, args, s.run_dir(r.name), hooks);
    p.done(o);
    s.set_outcome(std::move(o));
  }
}

void print_results(const Session& s, const Part& part, const PartResult& res) {
  if (!part.observe.empty()) {
    heading("Observe");
    for (size_t i = 0; i < part.observe.size(); ++i) {
      const Observe& ob = part.observe[i];
      std::string where = "In the " + ob.view + " view";
      if (!ob.layer.empty()) where += ", layer " + ob.layer;
      if (ob.channel >= 0) where += ", channel " + std::to_string(ob.channel);
      if (ob.step >= 0) where += ", iteration " + std::to_string(ob.step);
      if (ob.ring_step >= 0) where += ", ring step " + std::to_string(ob.ring_step);
      std::string runs;
      for (const std::string& r : ob.runs) runs += (runs.empty() ? "" : " and ") + r;
      std::printf("%s", wrap("- " + where + " (run " + runs + "): " + reflow(res.observations[i]), "  ").c_str());
    }
    std::printf("%s", wrap("(see it live: dtlab gui --lesson " + s.lesson().id + ")", "  ").c_str());
  }
  heading("Predictions against the measurements");
  for (const PredictionResult& p : res.predictions) {
    const Prediction& pr = *p.prediction;
    std::string mine = p.answer ? p.answer->value : "(none)";
    if (p.answer && p.answer->automatic) mine += " (auto)";
    std::printf("  %s: you said %s%s; measured: %s  -> %s\n", pr.id.c_str(), mine.c_str(),
                pr.kind == "numeric" && !pr.unit.empty() && p.answer ? (" " + pr.unit).c_str() : "", p.truth().c_str(),
                p.correct ? "right" : "not right");
    if (!p.misconception.empty()) std::printf("%s", wrap("About " + p.answer->value + ": " + p.misconception, "    ").c_str());
    if (!p.error.empty()) std::printf("    (could not decide: %s)\n", p.error.c_str());
  }
  if (!res.hints.empty()) {
    heading("Hints");
    for (const std::string& h : res.hints) std::printf("%s", wrap("- " + h, "  ").c_str());
  }
  heading("Checks (what the lab measured, tested against the lesson's claim)");
  for (const CheckResult& c : res.checks) {
    std::string vals;
    for (const auto& [k, v] : c.values) vals += (vals.empty() ? "" : ", ") + k + "=" + v;
    // a timing check on a busy machine: what it measured, and why that cannot judge the claim
    const char* verdict = !c.judged ? "----" : c.passed ? "PASS" : "FAIL";
    std::printf("  %s  %-24s %s\n", verdict, c.id.c_str(), c.that.c_str());
    if (!vals.empty()) std::printf("%s", wrap(vals, "        ", 160).c_str());
    if (!c.judged) std::printf("%s", wrap(c.not_judged + "; as measured it " + (c.passed ? "holds" : "does not hold"), "        ").c_str());
    if (c.judged && !c.passed && !c.error.empty()) std::printf("%s", wrap("error: " + c.error, "        ").c_str());
    if ((!c.judged || !c.passed) && !c.why.empty()) std::printf("%s", wrap("claim: " + c.why, "        ").c_str());
  }
  heading("Explanation");
  std::printf("%s", wrap(res.explanation, "  ").c_str());
}

int cmd_run(const LessonCommandOptions& o) {
  const std::string path = resolve_lesson(o.lesson);
  Lesson lesson = load_lesson(path);
  for (const std::string& r : lesson.requires_) {
    const std::string why = missing_requirement(r);
    if (!why.empty()) {
      std::printf("lesson %s skipped: it requires %s: %s\n", lesson.id.c_str(), r.c_str(), why.c_str());
      return kExitLessonSkipped;
    }
  }
  std::string prepared = o.prepared;
  if (prepared == "default") prepared = prepared_dir(lesson.id);
  if (!prepared.empty() && !fs::is_directory(prepared))
    throw lab::IoError("--prepared: " + prepared + " does not exist", "dtlab lesson prepare " + lesson.id + " makes it");
  const std::string out = !o.out_dir.empty() ? o.out_dir : new_session_dir(lesson.id);
  prepare_lesson_dir(out, lesson, o.overwrite, "--out");
  fs::create_directories(out);
  mark_lesson_dir(out, lesson, "session");
  // replaying: the runs are read where they were prepared; the record goes to `out`
  Session s(lesson, prepared.empty() ? out : prepared);
  std::vector<const Part*> parts;
  for (const Part* p : s.lesson().parts())
    if (o.part.empty() || o.part == p->id) parts.push_back(p);
  if (parts.empty()) {
    std::string ids;
    for (const Part* p : s.lesson().parts()) ids += (ids.empty() ? "" : ", ") + p->id;
    throw lab::ConfigError("--part: lesson " + lesson.id + " has no part '" + o.part + "' (parts: " + ids + ")");
  }
  bool interactive = false;
  collect_answers(s, parts, o, interactive);
  print_question(s.lesson());
  int failed = 0, unjudged = 0;
  std::string unjudged_ids;
  double seconds = 0;
  for (const Part* part : parts) {
    if (part->id != "main") {
      heading("Variation " + part->id + ": " + part->title);
      std::printf("%s", wrap(part->text, "  ").c_str());
    }
    heading("Your prediction" + std::string(part->predictions.size() > 1 ? "s" : ""));
    for (const Prediction& p : part->predictions) {
      if (const Answer* a = s.answer_of(p.id)) {
        print_prediction(p);
        std::printf("  Locked: %s%s\n", a->value.c_str(), a->confidence ? (" (confidence " + std::to_string(a->confidence) + ")").c_str() : "");
      } else if (s.auto_answers()) {
        print_prediction(p);
        std::printf("  (answered automatically with what the runs measure: --answers auto)\n");
      } else {
        ask(s, p);
      }
    }
    // runs the part reads from the main part (variations extend them) are done by then
    heading("Runs");
    run_part(s, *part, prepared);
    for (const RunSpec& r : part->runs) seconds += s.outcome(r.name)->seconds;
    const PartResult& res = s.evaluate(*part);
    print_results(s, *part, res);
    failed += res.failed_checks();
    unjudged += res.unjudged_checks();
    for (const CheckResult& c : res.checks)
      if (!c.judged) unjudged_ids += (unjudged_ids.empty() ? "" : ", ") + c.id;
  }
  (void)interactive;
  if (!s.lesson().teacher.notes.empty() && o.teacher) {
    heading("Teacher notes");
    std::printf("%s", wrap(s.lesson().teacher.notes, "  ").c_str());
  }
  const std::string record = out + "/record.json";
  commands::write_result_json(record, s.record("headless", learner_name()));
  std::printf("\n%s: %d check%s failed; runs took %.1f s (budget %g s)%s\nrecord: %s\n",
              failed ? "FAILED" : unjudged ? "every judged check holds" : "all checks hold", failed, failed == 1 ? "" : "s",
              seconds, lesson.budget_s, seconds > lesson.budget_s ? " -- over budget" : "", record.c_str());
  if (failed) return kExitLessonCheckFailed;
  if (unjudged) {
    // skipped, not passed: a claim about speed was not verified here
    std::printf("lesson %s skipped: %d timing check%s not judged (%s): this machine was too busy to time them; run it "
                "again when it is idle\n",
                lesson.id.c_str(), unjudged, unjudged == 1 ? "" : "s", unjudged_ids.c_str());
    return kExitLessonSkipped;
  }
  return lab::kExitOk;
}

// ---- 4. report, prepare ----

int cmd_report(const LessonCommandOptions& o) {
  std::vector<RecordFile> all = find_records(o.dirs);
  std::vector<RecordFile> recs;
  size_t automatic = 0;
  for (RecordFile& r : all) {
    if (!o.include_auto && r.record.value("answers", "") == "auto") {
      ++automatic;
      continue;
    }
    recs.push_back(std::move(r));
  }
  std::printf("%zu record%s", recs.size(), recs.size() == 1 ? "" : "s");
  if (automatic) std::printf(" (%zu answered automatically left out: --include-auto)", automatic);
  std::printf("\n\n%s", choice_rates(recs).c_str());
  std::ofstream f(o.csv, std::ios::trunc);
  f << records_csv(recs);
  if (!f) throw lab::IoError("cannot write " + o.csv);
  size_t rows = 0;
  for (const RecordFile& r : recs)
    for (const auto& p : r.record["parts"]) rows += p.value("predictions", nlohmann::json::array()).size();
  std::printf("\nCSV: %s (%zu rows, one per record and prediction)\n", o.csv.c_str(), rows);
  return lab::kExitOk;
}

// ---- 5. torch-check, mutate ----

// The Python that runs torch checks: $DTLAB_PYTHON, else Debian's (python3-torch lives there), else
// the first python3 on PATH.
std::string torch_python() {
  if (const char* p = std::getenv("DTLAB_PYTHON"); p && *p) return p;
  std::error_code ec;
  if (fs::exists("/usr/bin/python3", ec)) return "/usr/bin/python3";
  return "python3";
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

int cmd_torch_check(const LessonCommandOptions& o) {
  const Lesson lesson = load_lesson(resolve_lesson(o.lesson));
  if (lesson.torch_checks.empty()) {
    std::printf("lesson %s has no [[torch_check]]: it states nothing about PyTorch that needs checking\n", lesson.id.c_str());
    return lab::kExitOk;
  }
  const std::string python = torch_python();
  int failed = 0, skipped = 0, scripts = 0;
  std::string skip_reason;
  for (const TorchCheck& c : lesson.torch_checks) {
    if (!c.cite.empty()) {
      std::printf("  CITE  %-28s %s\n", c.id.c_str(), c.claim.c_str());
      std::printf("%s", wrap("source: " + c.cite, "        ").c_str());
      continue;
    }
    ++scripts;
    const std::string script = (fs::path(lesson.file).parent_path() / c.script).string();
    const std::string cmd = shell_quote(python) + " " + shell_quote(script) + " 2>&1";
    std::FILE* pipe = popen(cmd.c_str(), "r");
    if (!pipe) throw lab::IoError("cannot run " + cmd);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    const int status = pclose(pipe);
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const char* verdict = rc == 0 ? "PASS" : rc == kExitLessonSkipped ? "SKIP" : "FAIL";
    std::printf("  %s  %-28s %s\n", verdict, c.id.c_str(), c.claim.c_str());
    std::printf("%s", wrap(out, "        ", 160).c_str());
    if (rc == kExitLessonSkipped) {
      ++skipped;
      if (skip_reason.empty()) skip_reason = out.substr(0, out.find('\n'));
    } else if (rc != 0) {
      ++failed;
    }
  }
  std::printf("%s: %zu torch check%s, %d failed, %d skipped\n", lesson.id.c_str(), lesson.torch_checks.size(),
              lesson.torch_checks.size() == 1 ? "" : "s", failed, skipped);
  if (failed) return kExitLessonCheckFailed;
  if (scripts > 0 && skipped == scripts) {
    std::printf("skipped: %s\n", skip_reason.c_str());
    return kExitLessonSkipped;
  }
  return lab::kExitOk;
}

int cmd_mutate(const LessonCommandOptions& o) {
  const Lesson lesson = load_lesson(resolve_lesson(o.lesson));
  for (const std::string& r : lesson.requires_) {
    const std::string why = missing_requirement(r);
    if (!why.empty()) {
      std::printf("lesson %s skipped: it requires %s: %s\n", lesson.id.c_str(), r.c_str(), why.c_str());
      return kExitLessonSkipped;
    }
  }
  if (lesson.mutations.empty()) {
    std::printf("lesson %s has no [[mutation]]: nothing shows that its checks fail when the lab is wrong "
                "(lessons/README.md, section 7)\n", lesson.id.c_str());
    return kExitLessonCheckFailed;
  }
  int unseen = 0, tried = 0, unjudged = 0;
  for (const Mutation& m : lesson.mutations) {
    if (!o.mutation.empty() && m.id != o.mutation) continue;
    ++tried;
    Lesson wrong = lesson;  // the lesson's runs with the mutation's flags appended
    std::vector<Part*> parts = {&wrong.main};
    for (Part& v : wrong.variations) parts.push_back(&v);
    for (Part* p : parts)
      for (RunSpec& r : p->runs) {
        const bool named = std::find(m.runs.begin(), m.runs.end(), r.name) != m.runs.end();
        if (m.runs.empty() ? r.command == "run" : named) r.args.insert(r.args.end(), m.args.begin(), m.args.end());
      }
    char tmpl[] = "/tmp/dtlab-mutate-XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (!dir) throw lab::IoError("cannot create a temporary folder for the mutation's runs");
    heading("Mutation " + m.id + ": " + m.what);
    if (!m.lab.empty()) std::printf("  lab mutation: DTLAB_MUTATE=%s\n", m.lab.c_str());
    if (!m.args.empty())  // command_line("", args) is "dtlab  " and the flags
      std::printf("  flags added: %s\n", commands::command_line("", m.args).substr(7).c_str());
    if (!m.lab.empty()) setenv("DTLAB_MUTATE", m.lab.c_str(), 1);
    // Only the runs the named checks read: the others cannot change whether those fail.
    const std::vector<std::string> needed = runs_read_by_checks(wrong, m.breaks);
    size_t total = 0;
    for (const Part* p : wrong.parts()) total += p->runs.size();
    std::printf("  runs: %zu of the lesson's %zu (those the checks named read)\n", needed.size(), total);
    std::map<std::string, CheckResult> checks;
    // Other programs' CPU time on any core while the runs ran (the runs use them all).
    const lab::Contention contention(CPU_SETSIZE);
    double others = -1;
    try {
      Session s(wrong, dir);
      s.set_auto_answers(true);
      for (const Part* p : s.lesson().parts()) run_part(s, *p, "", &needed);
      others = contention.cores();
      for (const Part* p : s.lesson().parts())
        for (const CheckResult& c : s.evaluate_checks(*p, m.breaks)) checks[c.id] = c;
    } catch (...) {
      unsetenv("DTLAB_MUTATE");
      std::error_code ec;
      fs::remove_all(dir, ec);
      throw;
    }
    unsetenv("DTLAB_MUTATE");
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (m.timing) {
      // Its fault shows only in wall-clock time: a busy machine's own overhead can meet the bound
      // the check tests, so the mutation is judged only while the machine was quiet.
      char line[160];
      std::snprintf(line, sizeof line, "other programs took %.2f cores while its runs ran (judged below %.2f)", others,
                    kMutationQuietCores);
      if (others >= kMutationQuietCores) {
        ++unjudged;
        std::printf("  NOT JUDGED: a timing mutation, and %s\n", line);
        continue;
      }
      std::printf("  timing mutation: %s\n", others < 0 ? "other programs' CPU time unknown (/proc/stat unreadable)" : line);
    }
    for (const std::string& id : m.breaks) {
      const CheckResult& c = checks[id];
      // A check the mutation made unreadable (an error) has not shown that it sees the fault.
      const bool seen = !c.passed && c.error.empty();
      if (!seen) ++unseen;
      std::printf("  %s  %-28s %s\n", seen ? "FAILS (as it must)" : c.passed ? "STILL PASSES" : "ERROR", id.c_str(),
                  c.that.c_str());
      std::string vals;
      for (const auto& [k, v] : c.values) vals += (vals.empty() ? "" : ", ") + k + "=" + v;
      if (!vals.empty()) std::printf("%s", wrap(vals, "        ", 160).c_str());
      if (!c.error.empty()) std::printf("%s", wrap("error: " + c.error, "        ").c_str());
    }
  }
  if (tried == 0) throw lab::ConfigError("--mutation: lesson " + lesson.id + " has no mutation '" + o.mutation + "'");
  std::string verdict = unseen ? std::to_string(unseen) + " check(s) did not fail where they must: they cannot see the fault they name"
                               : "every check named fails when the lab is wrong in its respect";
  if (unjudged)
    verdict += "; " + std::to_string(unjudged) + " timing mutation" + (unjudged == 1 ? "" : "s") +
               " not judged: the machine was busy";
  std::printf("\n%s: %d mutation%s; %s\n", lesson.id.c_str(), tried, tried == 1 ? "" : "s", verdict.c_str());
  if (unseen) return kExitLessonCheckFailed;
  return unjudged == tried ? kExitLessonSkipped : lab::kExitOk;
}

int cmd_prepare(const LessonCommandOptions& o) {
  const Lesson lesson = load_lesson(resolve_lesson(o.lesson));
  for (const std::string& r : lesson.requires_) {
    const std::string why = missing_requirement(r);
    if (!why.empty()) {
      std::printf("lesson %s cannot be prepared here: it requires %s: %s\n", lesson.id.c_str(), r.c_str(), why.c_str());
      return kExitLessonSkipped;
    }
  }
  const std::string dir = o.out_dir.empty() ? prepared_dir(lesson.id) : o.out_dir;
  prepare_lesson_dir(dir, lesson, o.overwrite, o.out_dir.empty() ? "the prepared folder" : "--out");
  fs::create_directories(dir);
  mark_lesson_dir(dir, lesson, "prepare");
  Session s(lesson, dir);
  std::printf("preparing lesson %s into %s\n", lesson.id.c_str(), dir.c_str());
  nlohmann::json runs = nlohmann::json::object();
  for (const Part* part : s.lesson().parts()) {
    run_part(s, *part, "");
    for (const RunSpec& r : part->runs) runs[r.name] = s.outcome(r.name)->command_line();
  }
  commands::write_result_json(dir + "/prepared.json", {{"format", "dtlab-lesson-prepared"},
                                                  {"lesson", lesson.id},
                                                  {"version", lesson.version},
                                                  {"file", lesson.file},
                                                  {"prepared", iso_now()},
                                                  {"runs", runs}});
  std::printf("prepared: dtlab gui --lesson %s replays it (or dtlab lesson run %s --prepared %s)\n", lesson.id.c_str(),
              lesson.id.c_str(), dir.c_str());
  return lab::kExitOk;
}

}  // namespace

// ---- 6. the command line ----

CLI::App* add_lesson_command(CLI::App& app, LessonCommandOptions& o) {
  CLI::App* lesson = app.add_subcommand("lesson", "lessons: predict, run, observe, check, explain (lessons/README.md)");
  lesson->require_subcommand(1);
  lesson->add_subcommand("list", "the lessons: id, minutes, requirements, title");
  CLI::App* show = lesson->add_subcommand("show", "a lesson's question and choices (nothing revealed)");
  show->add_option("lesson", o.lesson, "lesson id or .toml file")->required();
  show->add_flag("--teacher", o.teacher, "also the teacher notes");
  CLI::App* check = lesson->add_subcommand("check", "check lesson files without running them (every problem as file:line:col)");
  check->add_option("files", o.files, "lesson files (default: every lesson found)");
  CLI::App* run = lesson->add_subcommand("run", "take a lesson: predict, run, observe, check, explain");
  run->add_option("lesson", o.lesson, "lesson id or .toml file")->required();
  run->add_option("--answers", o.answers, "predictions as ID=ANSWER,... (choice key or number), or auto (the measured "
                                          "truth: for tests); asked on a terminal otherwise");
  run->add_option("--confidence", o.confidence, "confidence per prediction, ID=1..5,...");
  run->add_option("--why", o.why, "the reason for an answer, ID=text,... (kept in the record)");
  run->add_option("--out", o.out_dir, "where the runs and record.json go (default: a new folder under the user's data "
                                      "directory, ~/.local/share/dtlab/lessons/runs)");
  run->add_flag("--overwrite", o.overwrite, "replace an earlier session of this lesson in --out (its record and runs)");
  run->add_option("--prepared", o.prepared, "replay the runs prepared by `dtlab lesson prepare` instead of training "
                                            "(default folder: give 'default')");
  run->add_option("--part", o.part, "only this part: main or a variation's id");
  run->add_flag("--teacher", o.teacher, "also show the teacher notes");
  CLI::App* report = lesson->add_subcommand("report", "per-choice rates and a CSV from a folder of learners' records");
  report->add_option("dirs", o.dirs, "folders or files of records (record.json, or the app's records folder)")->required();
  report->add_option("--csv", o.csv, "where to write the CSV")->capture_default_str();
  report->add_flag("--include-auto", o.include_auto, "also records answered with --answers auto");
  CLI::App* torch = lesson->add_subcommand("torch-check", "run a lesson's checks of what it says about PyTorch "
                                                          "([[torch_check]], with python3-torch)");
  torch->add_option("lesson", o.lesson, "lesson id or .toml file")->required();
  CLI::App* mutate = lesson->add_subcommand("mutate", "run a lesson with the lab made wrong ([[mutation]]): the checks "
                                                      "named must fail");
  mutate->add_option("lesson", o.lesson, "lesson id or .toml file")->required();
  mutate->add_option("--mutation", o.mutation, "only this mutation (default: every one)");
  CLI::App* prepare = lesson->add_subcommand("prepare", "run a lesson's runs ahead of class; the app then replays them");
  prepare->add_option("lesson", o.lesson, "lesson id or .toml file")->required();
  prepare->add_option("--out", o.out_dir, "folder (default: ~/.local/share/dtlab/lessons/prepared/ID)");
  prepare->add_flag("--overwrite", o.overwrite, "prepare again over this lesson's earlier prepared runs");
  return lesson;
}

int run_lesson_command(CLI::App& lesson_cmd, LessonCommandOptions& o) {
  if (lesson_cmd.got_subcommand("list")) return cmd_list();
  if (lesson_cmd.got_subcommand("show")) return cmd_show(o);
  if (lesson_cmd.got_subcommand("check")) return cmd_check(o);
  if (lesson_cmd.got_subcommand("run")) return cmd_run(o);
  if (lesson_cmd.got_subcommand("report")) return cmd_report(o);
  if (lesson_cmd.got_subcommand("prepare")) return cmd_prepare(o);
  if (lesson_cmd.got_subcommand("torch-check")) return cmd_torch_check(o);
  if (lesson_cmd.got_subcommand("mutate")) return cmd_mutate(o);
  return lab::kExitUsage;
}
