// Lessons: the file format's checks (every problem as file:line:col), the session (runs,
// quantities, predictions, checks, hints, the record), prepared runs, requirements and the
// teacher's report. The shipped lessons themselves run under the "lesson" label (CMakeLists).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bn_stats.h"
#include "catalog.h"
#include "collective_sim.h"
#include "lesson.h"
#include "lesson_runs.h"
#include "report.h"
#include "session.h"
#include "test_util.h"
#include "topology.h"

namespace {

using namespace lessons;

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// A small valid lesson; tests replace parts of it.
const char* kGood = R"TOML(format_version = 1
id = "tiny"
version = 2
title = "A tiny lesson"
minutes = 5
budget_s = 30

[question]
text = "Does a batch of one break BatchNorm?"

[[predict]]
id = "breaks"
kind = "choice"
prompt = "65 samples, batch 32: what happens?"

[[predict.choices]]
key = "a"
text = "It fails"
correct_if = "one_exit != 0"

[[predict.choices]]
key = "b"
text = "It trains"
correct_if = "one_exit == 0"
misconception = "BatchNorm needs two values per channel"

[[predict]]
id = "steps"
kind = "numeric"
prompt = "How many steps with drop_last?"
answer = "dropped_steps"
atol = 0.5
unit = "steps"

[runs.one]
args = "--model mlp --batch-size 32 --limit-train 65 --limit-test 64 --epochs 1 --no-shuffle"
expect_exit = 5
expect_error = "Expected more than 1 value per channel"

[runs.dropped]
base = "one"
args = "--drop-last"

[quantities]
one_exit = { run = "one", exit_code = true }
one_error = { run = "one", error = true }
dropped_steps = { run = "dropped", summary = "/steps_per_epoch" }
loss0 = { run = "dropped", metrics = "loss", step = 0, rank = 0 }
losses = { run = "dropped", metrics = "loss", reduce = "series" }
running = { run = "dropped", tensor = "2.running_mean" }
twice = { expr = "2 * dropped_steps" }

[[check]]
id = "fails_with_pytorch_text"
that = "one_exit == 5 and contains(one_error, 'Expected more than 1 value per channel')"
why = "PyTorch's error"

[[check]]
id = "drop_last_steps"
that = "dropped_steps == 2 and twice == 4 and len(losses) == 2 and loss0 > 0"
why = "floor(65 / 32)"

[[hint]]
text = "Count the samples in the last batch."

[explain]
text = "It failed with exit {one_exit:d}; with drop_last there were {dropped_steps:d} steps ({twice:.1f} doubled), first loss {loss0:.3f}. {{literal}}"
)TOML";

std::string write_lesson(const testutil::TempDir& dir, const std::string& text, const std::string& name = "tiny.toml") {
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

// The diagnostics of a lesson text that must not load.
std::vector<Diagnostic> problems(const std::string& text, const std::string& path = "lessons/tiny.toml") {
  try {
    parse_lesson(text, path);
  } catch (const LessonError& e) {
    return e.diagnostics();
  }
  ADD_FAILURE() << "the lesson loaded";
  return {};
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(LessonFile, GoodLessonLoads) {
  const Lesson l = parse_lesson(kGood, "lessons/tiny.toml");
  EXPECT_EQ(l.id, "tiny");
  EXPECT_EQ(l.version, 2);
  ASSERT_EQ(l.main.runs.size(), 2u);
  EXPECT_EQ(l.main.runs[0].name, "one");  // declaration order, not the table's sorted order
  EXPECT_EQ(l.main.runs[1].name, "dropped");
  // base's args first, then its own: the CLI takes the last value of a flag
  EXPECT_EQ(l.main.runs[1].args.back(), "--drop-last");
  EXPECT_TRUE(l.main.runs[1].parsed.run.drop_last);
  EXPECT_EQ(l.main.runs[0].parsed.run.limit_train, 65);
  EXPECT_EQ(l.main.predictions.size(), 2u);
}

TEST(LessonFile, TomlSyntaxErrorHasLineAndColumn) {
  const auto d = problems(replace(kGood, "minutes = 5", "minutes = = 5"));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].pos.line, 5);
  EXPECT_GT(d[0].pos.col, 1);
  EXPECT_TRUE(contains(d[0].format(), "lessons/tiny.toml:5:")) << d[0].format();
  EXPECT_TRUE(contains(d[0].message, "TOML")) << d[0].message;
}

TEST(LessonFile, UnknownKeyNamesTheKeyAndWhere) {
  const auto d = problems(replace(kGood, "minutes = 5", "minutes = 5\nbudget = 3"));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].pos.line, 6);
  EXPECT_EQ(d[0].pos.col, 1);
  EXPECT_TRUE(contains(d[0].message, "unknown key 'budget' in the top level")) << d[0].message;
  // in a nested table too
  const auto d2 = problems(replace(kGood, "text = \"It fails\"", "text = \"It fails\"\ncorrect = \"x\""));
  ASSERT_FALSE(d2.empty());
  EXPECT_TRUE(contains(d2[0].message, "unknown key 'correct'")) << d2[0].message;
}

TEST(LessonFile, WrongTypeIsNamed) {
  const auto d = problems(replace(kGood, "minutes = 5", "minutes = \"five\""));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].pos.line, 5);
  EXPECT_TRUE(contains(d[0].message, "key 'minutes' in the top level must be a number, got a string")) << d[0].message;
}

TEST(LessonFile, FlagThatDtlabRunRefusesIsReported) {
  const auto d = problems(replace(kGood, "--limit-test 64", "--limit-test 64 --wrld-size 4"));
  ASSERT_FALSE(d.empty());
  EXPECT_TRUE(contains(d[0].message, "run 'one'")) << d[0].message;
  EXPECT_TRUE(contains(d[0].message, "--wrld-size")) << d[0].message;
  EXPECT_EQ(d[0].pos.line, 35);  // the [runs.one] header
  // a value lab::validate refuses, in PyTorch's words; the extending run inherits it
  const auto d2 = problems(replace(kGood, "--batch-size 32", "--batch-size 0"));
  ASSERT_FALSE(d2.empty());
  EXPECT_TRUE(contains(d2[0].message, "batch_size should be a positive integer value, but got batch_size=0")) << d2[0].message;
  // the runner chooses where runs write
  const auto d3 = problems(replace(kGood, "--drop-last", "--drop-last --out /tmp/x"));
  ASSERT_FALSE(d3.empty());
  EXPECT_TRUE(contains(d3[0].message, "drop --out")) << d3[0].message;
}

// A flag that has no effect in its run (lab/core/config_effects.h) is a problem of the file, said
// once at the run that gives it, not again at the runs extending it.
TEST(LessonFile, FlagWithoutEffectIsReportedOnce) {
  const auto d = problems(replace(kGood, "--limit-test 64", "--limit-test 64 --lr-t-max 5"));
  ASSERT_EQ(d.size(), 1u) << d.back().message;
  EXPECT_TRUE(contains(d[0].message, "run 'one'")) << d[0].message;
  EXPECT_TRUE(contains(d[0].message, "--lr-t-max 5 has no effect: --lr-schedule is constant (it applies to cosine)"))
      << d[0].message;
  EXPECT_EQ(d[0].pos.line, 35);
  // in the extending run only
  const auto d2 = problems(replace(kGood, "--drop-last", "--drop-last --bn sync"));
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_TRUE(contains(d2[0].message, "run 'dropped'")) << d2[0].message;
  EXPECT_TRUE(contains(d2[0].message, "--bn sync has no effect: with one rank")) << d2[0].message;
  // bench train's rules too
  const auto d3 = problems(replace(kGood, "[runs.dropped]",
                                   "[runs.bench]\ncommand = \"bench train\"\nargs = \"--world-size 2 --threads 2\"\n\n"
                                   "[runs.dropped]"));
  ASSERT_EQ(d3.size(), 1u);
  EXPECT_TRUE(contains(d3[0].message, "--threads 2 has no effect")) << d3[0].message;
}

TEST(LessonFile, UnknownQuantityIsReportedWithASuggestion) {
  const auto d = problems(replace(kGood, "that = \"dropped_steps == 2", "that = \"droped_steps == 2"));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(contains(d[0].message, "'droped_steps' is not a quantity (did you mean 'dropped_steps'?)")) << d[0].message;
  // a quantity reading an undeclared run
  const auto d2 = problems(replace(kGood, "loss0 = { run = \"dropped\"", "loss0 = { run = \"dropd\""));
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_TRUE(contains(d2[0].message, "run 'dropd' is not a run")) << d2[0].message;
  // a placeholder of the explanation
  const auto d3 = problems(replace(kGood, "{twice:.1f}", "{twise:.1f}"));
  ASSERT_EQ(d3.size(), 1u);
  EXPECT_TRUE(contains(d3[0].message, "'twise' is not a quantity")) << d3[0].message;
}

TEST(LessonFile, ExpressionSyntaxErrorPointsAtTheCharacter) {
  const auto d = problems(replace(kGood, "correct_if = \"one_exit != 0\"", "correct_if = \"one_exit !! 0\""));
  ASSERT_EQ(d.size(), 1u);
  // correct_if = "one_exit !! 0": the value starts at column 14, the bad token 9 characters in
  EXPECT_EQ(d[0].pos.col, 14 + 1 + 9) << d[0].format();
}

TEST(LessonFile, PredictionNeedsARuleAndAHint) {
  const auto d = problems(replace(kGood, "correct_if = \"one_exit != 0\"\n", ""));
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(contains(d[0].message, "has no correct_if")) << d[0].message;
  const auto d2 = problems(replace(kGood, "atol = 0.5\n", ""));
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_TRUE(contains(d2[0].message, "needs a tolerance")) << d2[0].message;
  const auto d3 = problems(replace(kGood, "[[hint]]\ntext = \"Count the samples in the last batch.\"\n", ""));
  ASSERT_EQ(d3.size(), 2u);  // both predictions
  EXPECT_TRUE(contains(d3[0].message, "prediction 'breaks' has no hint")) << d3[0].message;
}

TEST(LessonFile, EveryProblemIsReportedInFileOrder) {
  std::string bad = replace(kGood, "minutes = 5", "minutes = \"five\"\ncolour = 1");
  bad = replace(bad, "--limit-test 64", "--limit-test 64 --bn wrong");
  const auto d = problems(bad);
  ASSERT_GE(d.size(), 3u);
  for (size_t i = 1; i < d.size(); ++i) EXPECT_LE(d[i - 1].pos.line, d[i].pos.line);
}

TEST(LessonFile, IdMustMatchTheFileName) {
  const auto d = problems(kGood, "lessons/other.toml");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(contains(d[0].message, "differs from the file name 'other.toml'")) << d[0].message;
}

TEST(LessonFile, PlaceholdersAndFormats) {
  const auto ph = find_placeholders("a {x:.2f} b {{c}} {max(y, 2)} {'q:r'}");
  ASSERT_EQ(ph.size(), 3u);
  EXPECT_EQ(ph[0].format, ".2f");
  EXPECT_EQ(ph[1].expr.text(), "max(y, 2)");
  EXPECT_EQ(ph[2].format, "");  // the colon inside quotes is not a format
  EXPECT_EQ(format_value(Value::num(0.12345), ".2f"), "0.12");
  EXPECT_EQ(format_value(Value::num(1234567.0), ",.0f"), "1,234,567");
  EXPECT_EQ(format_value(Value::num(0.256), ".1%"), "25.6%");
  EXPECT_EQ(format_value(Value::num(6.0), "d"), "6");
  EXPECT_EQ(format_value(Value::num(3.57e-7), ".2g"), "3.6e-07");
  EXPECT_THROW(find_placeholders("{x:.2q}"), ExprError);
  EXPECT_THROW(find_placeholders("{x"), ExprError);
}

// ---- the session, on real (small) runs ----

class LessonSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testutil::have_dataset()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  }
  // Runs every run of the lesson's main part into out.
  static void run_all(Session& s) {
    for (const RunSpec& r : s.lesson().main.runs) s.set_outcome(execute_run(r, s.concrete_args(r), s.run_dir(r.name)));
  }
};

TEST_F(LessonSessionTest, RunsQuantitiesPredictionsChecksAndRecord) {
  testutil::TempDir dir;
  Session s(parse_lesson(kGood, "tiny.toml"), dir.path());
  s.answer("breaks", "b", 4, "BatchNorm is fine");
  EXPECT_THROW(s.answer("breaks", "a"), lab::ConfigError);   // locked
  EXPECT_THROW(s.answer("steps", "two"), lab::ConfigError);  // not a number
  EXPECT_THROW(s.answer("nope", "a"), lab::ConfigError);
  s.answer("steps", "2");
  EXPECT_TRUE(s.answered(s.lesson().main));
  run_all(s);
  const RunOutcome* one = s.outcome("one");
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->exit_code, 5);
  EXPECT_TRUE(contains(one->error, "Expected more than 1 value per channel when training, got input size torch.Size([1, 256])"))
      << one->error;
  EXPECT_TRUE(std::filesystem::exists(s.run_dir("one") + "/outcome.json"));

  const PartResult& r = s.evaluate(s.lesson().main);
  EXPECT_TRUE(r.passed());
  for (const CheckResult& c : r.checks) EXPECT_TRUE(c.passed) << c.id << ": " << c.error;
  ASSERT_EQ(r.predictions.size(), 2u);
  EXPECT_FALSE(r.predictions[0].correct);  // said b, it fails
  EXPECT_EQ(r.predictions[0].truth(), "a");
  EXPECT_TRUE(r.predictions[1].correct);
  ASSERT_TRUE(r.predictions[1].measured.has_value());
  EXPECT_EQ(*r.predictions[1].measured, 2.0);
  ASSERT_EQ(r.hints.size(), 1u);  // after the wrong answer
  EXPECT_TRUE(contains(r.explanation, "It failed with exit 5; with drop_last there were 2 steps (4.0 doubled), first loss "))
      << r.explanation;
  EXPECT_TRUE(contains(r.explanation, "{literal}"));
  bool have_running = false;
  for (const auto& [name, v] : r.quantities)
    if (name == "running") have_running = v.is_tensor() && v.tensor.size() == 256;
  EXPECT_TRUE(have_running);

  const nlohmann::json rec = s.record("headless", "ada");
  EXPECT_EQ(rec["format"], "dtlab-lesson-record");
  EXPECT_EQ(rec["lesson"]["id"], "tiny");
  EXPECT_EQ(rec["lesson"]["version"], 2);
  EXPECT_EQ(rec["learner"], "ada");
  EXPECT_TRUE(rec["passed"].get<bool>());
  EXPECT_EQ(rec["parts"][0]["predictions"][0]["answer"], "b");
  EXPECT_EQ(rec["parts"][0]["predictions"][0]["confidence"], 4);
  EXPECT_EQ(rec["parts"][0]["predictions"][0]["correct"], false);
  EXPECT_EQ(rec["parts"][0]["quantities"]["dropped_steps"], 2.0);
}

TEST_F(LessonSessionTest, AClaimTheLabDoesNotMeetFailsItsCheck) {
  testutil::TempDir dir;
  // claim: the batch of one trains (it does not), and both choices right at once
  std::string text = replace(kGood, "expect_exit = 5", "expect_exit = 0");
  text = replace(text, "expect_error = \"Expected more than 1 value per channel\"\n", "");
  text = replace(text, "correct_if = \"one_exit == 0\"", "correct_if = \"one_exit != 0\"");
  Session s(parse_lesson(text, "tiny.toml"), dir.path());
  s.set_auto_answers(true);
  run_all(s);
  const PartResult& r = s.evaluate(s.lesson().main);
  EXPECT_FALSE(r.passed());
  std::map<std::string, const CheckResult*> by_id;
  for (const CheckResult& c : r.checks) by_id[c.id] = &c;
  EXPECT_FALSE(by_id["run:one"]->passed);
  EXPECT_TRUE(contains(by_id["run:one"]->error, "Expected more than 1 value")) << by_id["run:one"]->error;
  EXPECT_FALSE(by_id["prediction:breaks"]->passed);
  EXPECT_TRUE(contains(by_id["prediction:breaks"]->error, "several choices are right")) << by_id["prediction:breaks"]->error;
  EXPECT_TRUE(by_id["drop_last_steps"]->passed);
}

TEST_F(LessonSessionTest, UnreadableQuantityFailsTheChecksThatNeedIt) {
  testutil::TempDir dir;
  // the failed run wrote no summary.json
  const std::string text = replace(kGood, "dropped_steps = { run = \"dropped\"", "dropped_steps = { run = \"one\"");
  Session s(parse_lesson(text, "tiny.toml"), dir.path());
  s.set_auto_answers(true);
  run_all(s);
  const PartResult& r = s.evaluate(s.lesson().main);
  EXPECT_FALSE(r.passed());
  bool found = false;
  for (const CheckResult& c : r.checks)
    if (c.id == "drop_last_steps") {
      found = true;
      EXPECT_FALSE(c.passed);
      EXPECT_TRUE(contains(c.error, "ended with exit code 5")) << c.error;
      EXPECT_TRUE(contains(c.error, "summary.json")) << c.error;
    }
  EXPECT_TRUE(found);
}

// ---- the command line: check, run, prepare, report, requirements ----

TEST(LessonCli, CheckPrintsFileLineColAndExits2) {
  testutil::TempDir dir;
  const std::string path = write_lesson(dir, replace(kGood, "minutes = 5", "minutes = 5\nbudget = 3"));
  const auto r = testutil::run_cli("lesson check " + path);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, path + ":6:1: unknown key 'budget' in the top level")) << r.out;
  const std::string good = write_lesson(dir, kGood, "tiny2.toml");
  const auto ok = testutil::run_cli("lesson check " + write_lesson(dir, kGood));
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  (void)good;
}

TEST(LessonCli, MissingRequirementSkipsWith77) {
  testutil::TempDir dir;
  const std::string path = write_lesson(dir, replace(kGood, "budget_s = 30", "budget_s = 30\nrequires = [\"cuda\"]"));
  const auto r = testutil::run_cli("lesson run " + path + " --answers auto --out " + dir.file("out"));
  EXPECT_EQ(r.exit_code, 77) << r.out;
  EXPECT_TRUE(contains(r.out, "requires cuda")) << r.out;
}

TEST(LessonCli, RunWithoutAnswersOffATerminalSaysHow) {
  testutil::TempDir dir;
  const std::string path = write_lesson(dir, kGood);
  const auto r = testutil::run_cli("lesson run " + path + " --out " + dir.file("out") + " < /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "no answer for predictions breaks, steps")) << r.out;
  EXPECT_TRUE(contains(r.out, "--answers")) << r.out;
}

TEST(LessonCli, RunPrepareReplayAndReport) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir dir;
  const std::string path = write_lesson(dir, kGood);
  // a learner's run: exit 0 although one prediction is wrong
  const auto r = testutil::run_cli("lesson run " + path + " --answers breaks=b,steps=2 --confidence breaks=2 --out " +
                                   dir.file("learner1"));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "breaks: you said b; measured: a  -> not right")) << r.out;
  EXPECT_TRUE(contains(r.out, "Count the samples in the last batch.")) << r.out;  // the hint
  EXPECT_TRUE(contains(r.out, "PASS  fails_with_pytorch_text")) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir.file("learner1/record.json")));

  // prepared ahead of class, then replayed: the same measurements, nothing trained
  const auto p = testutil::run_cli("lesson prepare " + path + " --out " + dir.file("prepared"));
  EXPECT_EQ(p.exit_code, 0) << p.out;
  const auto replay = testutil::run_cli("lesson run " + path + " --answers breaks=a,steps=3 --prepared " + dir.file("prepared") +
                                        " --out " + dir.file("learner2"));
  EXPECT_EQ(replay.exit_code, 0) << replay.out;
  EXPECT_TRUE(contains(replay.out, "(prepared)")) << replay.out;
  // a prepared folder of another version of the lesson is refused
  const std::string changed = write_lesson(dir, replace(kGood, "--no-shuffle", "--no-shuffle --seed 3"), "tiny.toml");
  const auto stale = testutil::run_cli("lesson run " + changed + " --answers auto --prepared " + dir.file("prepared") +
                                       " --out " + dir.file("learner3"));
  EXPECT_EQ(stale.exit_code, 2) << stale.out;
  EXPECT_TRUE(contains(stale.out, "made for another version of the lesson")) << stale.out;

  // a third learner, then the teacher's report over the folder
  write_lesson(dir, kGood);
  const auto r3 = testutil::run_cli("lesson run " + path + " --answers breaks=a,steps=5 --out " + dir.file("learner4"));
  EXPECT_EQ(r3.exit_code, 0) << r3.out;
  const auto rep = testutil::run_cli("lesson report " + dir.path() + " --csv " + dir.file("report.csv"));
  EXPECT_EQ(rep.exit_code, 0) << rep.out;
  EXPECT_TRUE(contains(rep.out, "3 records\n")) << rep.out;  // learner3's run was refused: no record
  // breaks: a twice (right), b once
  EXPECT_TRUE(contains(rep.out, "* a     2 of 3    66.7%")) << rep.out;
  EXPECT_TRUE(contains(rep.out, "  b     1 of 3    33.3%")) << rep.out;
  EXPECT_TRUE(contains(rep.out, "right: 2 of 3 (67%)")) << rep.out;
  const std::string csv = testutil::read_file(dir.file("report.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 3 * 2) << csv;  // header + 3 records x 2 predictions
  EXPECT_TRUE(contains(csv, "record,learner,lesson,lesson_version")) << csv;
}

// A session or preparation that never finished (Ctrl-C, a test's time limit) leaves its runs and
// the folder's marker: the folder is named as unfinished, refused unasked, and --overwrite reuses
// it; a folder without the marker is never taken.
TEST(LessonFolder, AnInterruptedSessionIsNamedAndOverwriteReusesIt) {
  testutil::TempDir dir;
  const Lesson l = parse_lesson(kGood, "lessons/tiny.toml");
  const std::string out = dir.file("session");
  std::filesystem::create_directories(out + "/dropped");
  mark_lesson_dir(out, l, "session");
  testutil::write_file(out + "/dropped/metrics.jsonl", "");
  testutil::write_file(out + "/notes.txt", "the teacher's");
  try {
    prepare_lesson_dir(out, l, false, "--out");
    ADD_FAILURE() << "an unfinished session was replaced unasked";
  } catch (const lab::IoError& e) {
    EXPECT_TRUE(contains(e.what(), "already holds an unfinished session of lesson 'tiny' (started ")) << e.what();
  }
  prepare_lesson_dir(out, l, true, "--out");
  EXPECT_FALSE(std::filesystem::exists(out + "/dropped"));
  EXPECT_FALSE(std::filesystem::exists(out + "/lesson.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/notes.txt"));  // not the lesson's: kept

  const std::string other = dir.file("other");  // runs without the marker: not a lesson folder
  std::filesystem::create_directories(other + "/dropped");
  try {
    prepare_lesson_dir(other, l, true, "--out");
    ADD_FAILURE() << "a folder without the marker was taken";
  } catch (const lab::IoError& e) {
    EXPECT_TRUE(contains(e.what(), "is not empty and is not a lesson folder")) << e.what();
  }
  mark_lesson_dir(other, parse_lesson(replace(kGood, "id = \"tiny\"", "id = \"other\""), "lessons/other.toml"), "prepare");
  try {  // another lesson's unfinished preparation
    prepare_lesson_dir(other, l, true, "--out");
    ADD_FAILURE() << "another lesson's folder was taken";
  } catch (const lab::IoError& e) {
    EXPECT_TRUE(contains(e.what(), "holds an unfinished preparation of lesson 'other'")) << e.what();
  }
}

TEST(LessonReport, RatesFromRecords) {
  testutil::TempDir dir;
  auto rec = [&](const std::string& name, const std::string& answer, bool correct, int conf) {
    nlohmann::json j = {{"format", "dtlab-lesson-record"},
                        {"format_version", 1},
                        {"lesson", {{"id", "l"}, {"version", 1}, {"title", "T"}}},
                        {"learner", name},
                        {"answers", "learner"},
                        {"parts",
                         {{{"part", "main"},
                           {"predictions",
                            {{{"id", "p"},
                              {"kind", "choice"},
                              {"prompt", "Which?"},
                              {"answer", answer},
                              {"correct", correct},
                              {"confidence", conf},
                              {"truth", "a"},
                              {"right_choices", {"a"}},
                              {"choices", {{{"key", "a"}, {"text", "A"}}, {{"key", "b"}, {"text", "B"}}, {{"key", "c"}, {"text", "C"}}}}}}}}}}};
    std::ofstream(dir.file(name + ".json")) << j.dump();
  };
  rec("x", "a", true, 5);
  rec("y", "b", false, 2);
  rec("z", "a", true, 3);
  std::ofstream(dir.file("notes.json")) << "{\"not\": \"a record\"}";
  const auto records = find_records({dir.path()});
  ASSERT_EQ(records.size(), 3u);
  const std::string rates = choice_rates(records);
  EXPECT_TRUE(contains(rates, "* a     2 of 3    66.7%  A")) << rates;
  EXPECT_TRUE(contains(rates, "  c     0 of 3     0.0%  C")) << rates;
  EXPECT_TRUE(contains(rates, "mean confidence right 4.0, wrong 2.0")) << rates;
  EXPECT_TRUE(contains(rates, "35-70%: discuss in pairs")) << rates;
  const std::string csv = records_csv(records);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 4);
  // a broken record is an error naming the file
  std::ofstream(dir.file("broken.json")) << "{\"format\": \"dtlab-lesson-record\", ";
  EXPECT_THROW(find_records({dir.path()}), lab::IoError);
}

TEST(LessonCatalog, ShippedLessonsAllLoad) {
  const std::filesystem::path lessons_dir =
      std::filesystem::path(DTLAB_FIXTURES_DIR).parent_path().parent_path() / "lessons";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(lessons_dir)) {
    if (e.path().extension() != ".toml") continue;
    ++n;
    try {
      load_lesson(e.path().string());
    } catch (const std::exception& ex) {
      ADD_FAILURE() << ex.what();
    }
  }
  EXPECT_GE(n, 1);
}

}  // namespace

namespace {

// The authoring guide's complete example is the file that ctest runs (lesson.example).
TEST(LessonGuide, TheWorkedExampleIsTheExampleFile) {
  const std::filesystem::path root = std::filesystem::path(DTLAB_FIXTURES_DIR).parent_path().parent_path();
  const std::string guide = testutil::read_file((root / "lessons" / "README.md").string());
  const std::string start = "```toml\n# How does DistributedSampler";
  const size_t a = guide.find(start);
  ASSERT_NE(a, std::string::npos);
  const size_t b = guide.find("```", a + 7);
  ASSERT_NE(b, std::string::npos);
  const std::string block = guide.substr(a + 8, b - a - 8);
  EXPECT_EQ(block, testutil::read_file((root / "lessons" / "examples" / "sampler-shards.toml").string()));
  EXPECT_NO_THROW(lessons::load_lesson((root / "lessons" / "examples" / "sampler-shards.toml").string()));
}

}  // namespace

// Found by fuzzing (fuzz/fuzz_lesson.cpp): TOML that Debian's toml++ 3.3.0 cannot be given (a table
// header starting with a character no key starts with aborted dtlab on an assertion; some
// non-ASCII characters outside strings were undefined behaviour) is a lesson error at its line.
TEST(LessonFile, TomlThatTheTomlLibraryMishandlesIsAnErrorAtItsLine) {
  const std::string good = kGood;
  for (const std::string& bad : {std::string("\n[`teacher]\nnotes = \"x\"\n"), std::string("\nextra = [}\n"),
                                 std::string("\nm\xd1\xa8mot = 1\n")}) {
    const auto d = problems(good + bad);
    ASSERT_EQ(d.size(), 1u) << bad;
    EXPECT_EQ(d[0].pos.line, static_cast<int>(std::count(good.begin(), good.end(), '\n')) + 2) << d[0].format();
    EXPECT_TRUE(contains(d[0].message, "TOML")) << d[0].message;
  }
  // non-ASCII text in strings and comments is fine
  const Lesson l = parse_lesson(replace(kGood, "A tiny lesson", "A tiny lesson: \xc3\xa9, \xcf\x83, \xc3\x97") +
                                    "# \xc2\xa7 \xe3\x80\x81\n",
                                "lessons/tiny.toml");
  EXPECT_EQ(l.title, "A tiny lesson: \xc3\xa9, \xcf\x83, \xc3\x97");
}

// "How many buckets?": a summary or result quantity counts the array (or object) at its pointer.
TEST(LessonFile, SummaryQuantitiesTakeReduceCountOnly) {
  const std::string with = replace(kGood, "twice = { expr", "buckets = { run = \"dropped\", summary = \"/ddp/buckets\", reduce = \"count\" }\ntwice = { expr");
  EXPECT_NO_THROW(parse_lesson(with, "lessons/tiny.toml"));
  const auto p = problems(replace(with, "reduce = \"count\"", "reduce = \"mean\""));
  ASSERT_FALSE(p.empty());
  EXPECT_TRUE(contains(p[0].message, "takes only reduce = \"count\"")) << p[0].message;
}

TEST(LessonQuantity, CountsAnArrayOfObjects) {
  testutil::TempDir d;
  testutil::write_file(d.file("summary.json"),
                       R"({"ddp": {"buckets": [{"index": 0, "bytes": 1024}, {"index": 1, "bytes": 512}, {"index": 2, "bytes": 8}]}})");
  RunOutcome o;
  o.name = "r";
  o.dir = d.path();
  QuantitySpec q;
  q.name = "buckets";
  q.source = "summary";
  q.path = "/ddp/buckets";
  RunFiles files;
  try {  // without reduce: the error says how to count them
    files.read(q, o);
    ADD_FAILURE() << "an array of objects became a value";
  } catch (const QuantityError& e) {
    EXPECT_TRUE(contains(e.what(), "reduce = \"count\" counts them")) << e.what();
  }
  q.reduce = "count";
  const Value v = files.read(q, o);
  ASSERT_TRUE(v.is_number());
  EXPECT_EQ(v.number, 3);
  q.path = "/ddp";  // an object: its keys
  EXPECT_EQ(files.read(q, o).number, 1);
  q.path = "/ddp/buckets/0/bytes";  // a number has no count
  EXPECT_THROW(files.read(q, o), QuantityError);
}

// trace quantities: the durations of the timeline's spans, in seconds, filtered by name (a glob),
// rank (the span's process) and step; several spans need a reduction.
TEST(LessonQuantity, TraceSpansAreDurationsInSeconds) {
  testutil::TempDir d;
  testutil::write_file(d.file("trace.json"), R"({"traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}},
    {"name": "allreduce grad bucket 0", "ph": "X", "pid": 0, "tid": 1, "ts": 10, "dur": 1500, "args": {"step": 0}},
    {"name": "allreduce grad bucket 0", "ph": "X", "pid": 1, "tid": 1, "ts": 12, "dur": 250, "args": {"step": 0}},
    {"name": "allreduce grad bucket 1", "ph": "X", "pid": 0, "tid": 1, "ts": 20, "dur": 4000, "args": {"step": 0}},
    {"name": "allreduce grad bucket 0", "ph": "X", "pid": 0, "tid": 1, "ts": 90, "dur": 750, "args": {"step": 1}},
    {"name": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 8, "args": {"step": 0}}
  ]})");
  RunOutcome o;
  o.name = "r";
  o.dir = d.path();
  QuantitySpec q;
  q.name = "ar";
  q.source = "trace";
  q.path = "allreduce grad bucket 0";
  RunFiles files;
  try {  // three spans and no reduction: the error says how to choose
    files.read(q, o);
    ADD_FAILURE() << "three spans became one value";
  } catch (const QuantityError& e) {
    EXPECT_TRUE(contains(e.what(), "3 spans of trace.json match")) << e.what();
  }
  q.reduce = "min";
  EXPECT_DOUBLE_EQ(files.read(q, o).number, 250e-6);
  q.reduce = "series";
  const Value all = files.read(q, o);
  ASSERT_EQ(all.tensor.size(), 3u);
  EXPECT_DOUBLE_EQ(all.tensor[0], 1500e-6);
  EXPECT_DOUBLE_EQ(all.tensor[2], 750e-6);
  q.rank = 0;
  q.reduce = "max";
  EXPECT_DOUBLE_EQ(files.read(q, o).number, 1500e-6);
  q.step = 1;
  q.reduce.clear();
  EXPECT_DOUBLE_EQ(files.read(q, o).number, 750e-6);
  q.step.reset();
  q.rank.reset();
  q.path = "allreduce grad bucket *";  // a glob
  q.reduce = "sum";
  EXPECT_DOUBLE_EQ(files.read(q, o).number, 6500e-6);
  q.path = "allgather";  // no such span: the error lists the names there are
  try {
    files.read(q, o);
    ADD_FAILURE() << "a name no span has was read";
  } catch (const QuantityError& e) {
    EXPECT_TRUE(contains(e.what(), "no span of trace.json matches 'allgather'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "allreduce grad bucket 1, forward")) << e.what();
  }
}

TEST(LessonFile, TraceQuantitiesTakeRankStepAndReduce) {
  const std::string base = "ar = { run = \"dropped\", trace = \"allreduce grad bucket 0\", rank = 1, step = 2, reduce = \"min\" }\ntwice = { expr";
  const std::string with = replace(kGood, "twice = { expr", base);
  EXPECT_NO_THROW(parse_lesson(with, "lessons/tiny.toml"));
  auto p = problems(replace(with, "step = 2", "kind = \"eval\""));
  ASSERT_FALSE(p.empty());
  EXPECT_TRUE(contains(p[0].message, "'kind' filters metrics quantities, not trace")) << p[0].message;
  p = problems(replace(with, "reduce = \"min\"", "reduce = \"median\""));
  ASSERT_FALSE(p.empty());
  EXPECT_TRUE(contains(p[0].message, "unknown reduce 'median'")) << p[0].message;
}

// bn.* statistics come from bn_stats.bin as float32 values: read through the quantity, they are
// those floats exactly, so that a lesson can compare them bit for bit with the same buffer in a
// weights file (bn-ddp's broadcast_makes_ranks_agree).
TEST(LessonQuantity, BatchNormStatisticsAreTheRecordedFloats) {
  testutil::TempDir d;
  const std::vector<float> rm = {0.1f, 1.0f / 3.0f, -0.190534f};
  {
    lab::StepRecord r;
    r.rank = 0;
    r.step = 0;
    lab::BnLayerRecord b;
    b.layer = "2";
    b.count = 32;
    b.batch_mean = b.batch_var = b.running_var = {1.0f, 1.0f, 1.0f};
    b.running_mean = rm;
    r.bn.push_back(b);
    lab::BnStatsWriter w(d.file("bn_stats.bin"), 1);
    w.append({&r});
    w.flush();
  }
  testutil::write_file(d.file("metrics.jsonl"), R"({"kind":"step","rank":0,"step":0,"epoch":0,"loss":1.0})" "\n");
  RunOutcome o;
  o.name = "r";
  o.dir = d.path();
  QuantitySpec q;
  q.name = "rm";
  q.source = "metrics";
  q.path = "bn.running_mean";
  q.layer = "2";
  q.rank = 0;
  q.step = 0;
  RunFiles files;
  const Value v = files.read(q, o);
  ASSERT_EQ(v.tensor.size(), rm.size());
  for (size_t i = 0; i < rm.size(); ++i) EXPECT_EQ(v.tensor[i], static_cast<double>(rm[i])) << i;
}

// [[mutation]]: the lab made wrong in one respect; `dtlab lesson mutate` passes only when every
// check the mutation names fails (and was readable), and says which one still passes otherwise.
TEST(LessonMutation, ACheckThatSeesTheFaultFailsAndOneThatCannotIsNamed) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  const std::string good = std::string(kGood) + R"TOML(
[[mutation]]
id = "no_error"
what = "the last batch of one is dropped, so nothing fails"
args = "--drop-last"
runs = ["one"]
breaks = ["fails_with_pytorch_text"]
)TOML";
  auto r = testutil::run_cli("lesson mutate " + write_lesson(d, good));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "FAILS (as it must)  fails_with_pytorch_text")) << r.out;
  // a mutation that the named check cannot see
  const std::string blind = std::string(kGood) + R"TOML(
[[mutation]]
id = "blind"
what = "the dropped run gets --seed 3: its step count cannot change"
args = "--seed 3"
runs = ["dropped"]
breaks = ["drop_last_steps"]
)TOML";
  r = testutil::run_cli("lesson mutate " + write_lesson(d, blind, "tiny.toml"));
  EXPECT_EQ(r.exit_code, 8) << r.out;
  EXPECT_TRUE(contains(r.out, "STILL PASSES  drop_last_steps")) << r.out;
  // a lesson without mutations cannot show that its checks fail
  r = testutil::run_cli("lesson mutate " + write_lesson(d, kGood, "tiny.toml"));
  EXPECT_EQ(r.exit_code, 8) << r.out;
  EXPECT_TRUE(contains(r.out, "has no [[mutation]]")) << r.out;
}

// A timing mutation (its fault shows only in wall-clock time) is judged only on a quiet machine:
// with a thread of this test keeping a core busy, `lesson mutate` says NOT JUDGED with the CPU
// time other programs took, and skips (exit 77) since no mutation of the lesson could be judged.
TEST(LessonMutation, ATimingMutationIsNotJudgedOnABusyMachine) {
  DTLAB_REQUIRE_DATASET();
  testutil::TempDir d;
  std::string text = std::string(kGood) + R"TOML(
[[check]]
id = "trained_for_a_while"
that = "secs > 0"
timing = false
why = "a run takes time"

[[mutation]]
id = "other_seed"
what = "another seed (it cannot make training take no time)"
args = "--seed 3"
runs = ["dropped"]
breaks = ["trained_for_a_while"]
timing = true
)TOML";
  const std::string q = "[quantities]\n";
  text.replace(text.find(q), q.size(), q + "secs = { run = \"dropped\", summary = \"/train_seconds\", unit = \"s\" }\n");
  std::atomic<bool> stop{false};
  std::thread hog([&] {
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const auto r = testutil::run_cli("lesson mutate " + write_lesson(d, text));
  stop = true;
  hog.join();
  EXPECT_EQ(r.exit_code, 77) << r.out;
  EXPECT_TRUE(contains(r.out, "NOT JUDGED: a timing mutation, and other programs took ")) << r.out;
  EXPECT_TRUE(contains(r.out, "1 timing mutation not judged: the machine was busy")) << r.out;
  EXPECT_FALSE(contains(r.out, "STILL PASSES")) << r.out;
}

// `dtlab lesson mutate` runs only what the checks it names read: through their quantities (expr
// quantities followed, a variation's view of the main part's included) and the runs those runs read.
TEST(LessonMutation, OnlyTheRunsTheNamedChecksReadRun) {
  const std::string text = std::string(kGood) + R"TOML(
[runs.evaluated]
command = "eval"
args = "--run {run:dropped} --limit-test 64"

[runs.unread]
args = "--model mlp --batch-size 32 --limit-train 64 --limit-test 64 --epochs 1"

[[variation]]
id = "v"
title = "A variation"
text = "Reads the main part's quantity."

[[variation.predict]]
id = "more"
kind = "numeric"
prompt = "How many steps?"
answer = "own_steps"
atol = 0.5

[[variation.hint]]
text = "Count."

[variation.explain]
text = "{own_steps:d} steps."

[variation.runs.own]
args = "--model mlp --batch-size 16 --limit-train 64 --limit-test 64 --epochs 1"

[variation.quantities]
own_steps = { run = "own", summary = "/steps_per_epoch" }
both = { expr = "own_steps + twice" }
acc = { run = "evaluated", result = "/accuracy" }

[[variation.check]]
id = "through_main"
that = "both > 0"
why = "reads the variation's run and, through the main part's expr quantity, main's run 'dropped'"

[[variation.check]]
id = "through_after"
that = "acc >= 0"
why = "reads an eval run, which reads 'dropped'"

[[variation.check]]
id = "timed"
that = "own_steps > 0"
timing = false
why = "the variation's own run only"
)TOML";
  const Lesson l = parse_lesson(text, "lessons/tiny.toml");
  using V = std::vector<std::string>;
  EXPECT_EQ(runs_read_by_checks(l, {"fails_with_pytorch_text"}), V({"one"}));
  EXPECT_EQ(runs_read_by_checks(l, {"drop_last_steps"}), V({"dropped"}));  // twice is an expr over dropped_steps
  EXPECT_EQ(runs_read_by_checks(l, {"through_main"}), V({"dropped", "own"}));
  EXPECT_EQ(runs_read_by_checks(l, {"through_after"}), V({"dropped", "evaluated"}));
  EXPECT_EQ(runs_read_by_checks(l, {"timed"}), V({"own"}));
  EXPECT_EQ(runs_read_by_checks(l, {"fails_with_pytorch_text", "timed"}), V({"one", "own"}));
  EXPECT_EQ(runs_read_by_checks(l, {}), V());
}

TEST(LessonFile, MutationsAndTorchChecksAreChecked) {
  auto p = problems(std::string(kGood) + R"TOML(
[[mutation]]
id = "m"
what = "x"
lab = "no-such-mutation"
breaks = ["no_such_check"]

[[mutation]]
id = "clocked"
what = "y"
args = "--seed 3"
breaks = ["drop_last_steps"]
timing = true

[[torch_check]]
id = "t"
claim = "PyTorch does x"
)TOML");
  std::string all;
  for (const auto& x : p) all += x.message + "\n";
  EXPECT_TRUE(contains(all, "unknown lab mutation 'no-such-mutation' (known: ddp-broadcast-once")) << all;
  EXPECT_TRUE(contains(all, "no check 'no_such_check'")) << all;
  EXPECT_TRUE(contains(all, "give either script")) << all;
  EXPECT_TRUE(contains(all, "mutation 'clocked': no check it breaks reads a measured time: drop timing = true")) << all;
}

TEST(LessonTorchCheck, ScriptsPassFailOrSkipAndCitationsAreShown) {
  testutil::TempDir d;
  std::filesystem::create_directories(d.file("torch"));
  testutil::write_file(d.file("torch/holds.py"), "print('PyTorch does x: measured')\n");
  testutil::write_file(d.file("torch/fails.py"), "import sys\nprint('PyTorch does y instead')\nsys.exit(1)\n");
  testutil::write_file(d.file("torch/skip.py"), "import sys\nprint('skipped: no torch')\nsys.exit(77)\n");
  auto lesson = [&](const std::string& script) {
    return std::string(kGood) + "\n[[torch_check]]\nid = \"a\"\nclaim = \"PyTorch does x\"\nscript = \"torch/" + script +
           "\"\n\n[[torch_check]]\nid = \"b\"\nclaim = \"PyTorch does z\"\ncite = \"torch/nn/x.py: f() does z\"\n";
  };
  auto r = testutil::run_cli("lesson torch-check " + write_lesson(d, lesson("holds.py")));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "PASS  a")) << r.out;
  EXPECT_TRUE(contains(r.out, "CITE  b")) << r.out;
  EXPECT_TRUE(contains(r.out, "source: torch/nn/x.py: f() does z")) << r.out;
  r = testutil::run_cli("lesson torch-check " + write_lesson(d, lesson("fails.py")));
  EXPECT_EQ(r.exit_code, 8) << r.out;
  EXPECT_TRUE(contains(r.out, "FAIL  a")) << r.out;
  EXPECT_TRUE(contains(r.out, "PyTorch does y instead")) << r.out;
  r = testutil::run_cli("lesson torch-check " + write_lesson(d, lesson("skip.py")));
  EXPECT_EQ(r.exit_code, 77) << r.out;
}

// ---- simulate runs: `dtlab simulate` in a lesson, its points read with field and where ----

const char* kSim = R"TOML(format_version = 1
id = "sim"
version = 1
title = "The ring at scale"
minutes = 5
budget_s = 5

[question]
text = "Does the ring allreduce's busbw hold from 16 to 1,024 GPUs?"

[[predict]]
id = "holds"
kind = "choice"
prompt = "At 1,024 GPUs, does the ring keep its busbw?"

[[predict.choices]]
key = "a"
text = "Yes"
correct_if = "bw_1024 >= 0.8 * bw_16"

[[predict.choices]]
key = "b"
text = "No"
correct_if = "bw_1024 < 0.8 * bw_16"

[runs.sweep]
command = "simulate"
args = "--topology dgx-h100 --nodes 2,16,128 --collective allreduce --algorithm ring,dbtree --sizes 1M,16M"

[quantities]
bw_16 = { run = "sweep", result = "/points", where = { algorithm = "ring", ranks = 16, bytes = 16777216 }, field = "busbw_GBps" }
bw_1024 = { run = "sweep", result = "/points", where = { algorithm = "ring", ranks = 1024, bytes = 16_777_216 }, field = "busbw_GBps" }
lat_1024 = { run = "sweep", result = "/points", where = { algorithm = "ring", nodes = 128, bytes = 16777216 }, field = "latency_us" }
ring_lats = { run = "sweep", result = "/points", where = { algorithm = "ring", bytes = 16777216 }, field = "latency_us", reduce = "series" }
tree_wins = { run = "sweep", result = "/points", where = { algorithm = "dbtree", fastest = true }, reduce = "count" }
tree_wins_too = { run = "sweep", result = "/points", where = { algorithm = "dbtree" }, field = "fastest", reduce = "sum" }
nccl_trees = { run = "sweep", result = "/points", where = { algorithm = "ring", nodes = [16, 128], nccl_choice = "tree/*" }, reduce = "count" }
nowhere = { run = "sweep", result = "/points", where = { algorithm = "hier" }, reduce = "count" }
smallest = { run = "sweep", result = "/points", field = "bytes", reduce = "min" }
pick = { run = "sweep", result = "/points", where = { algorithm = "ring", ranks = 1024, bytes = 16777216 }, field = "nccl_choice" }

[[check]]
id = "collapses"
that = "bw_1024 < 0.05 * bw_16"
why = "the ring's 2(N-1) steps of latency"

[[hint]]
text = "Count the ring's steps."

[explain]
text = "{bw_16:.0f} to {bw_1024:.2f} GB/s"
)TOML";

// The point of the simulator itself: what the quantities must read, number for number.
lab::SimResult simulated(int nodes, lab::SimAlgorithm a, uint64_t bytes) {
  lab::Topology t = lab::topology_preset("dgx-h100");
  t.nodes = nodes;
  lab::SimOptions o;
  o.algorithm = a;
  return lab::simulate_collective(t, o, bytes);
}

TEST(LessonSimulate, QuantitiesReadTheSimulatorsPoints) {
  testutil::TempDir dir;
  Session s(parse_lesson(kSim, "sim.toml"), dir.path());
  s.set_auto_answers(true);
  const RunSpec& r = s.lesson().main.runs.at(0);
  EXPECT_EQ(r.command, "simulate");
  const std::vector<std::string> args = s.concrete_args(r);
  ASSERT_GE(args.size(), 2u);
  EXPECT_EQ(args[args.size() - 2], "--json");  // the runner chooses where the points go
  EXPECT_EQ(args.back(), s.run_dir("sweep") + "/result.json");
  const RunOutcome o = execute_run(r, args, s.run_dir("sweep"));
  ASSERT_EQ(o.exit_code, 0) << o.error;
  EXPECT_TRUE(std::filesystem::exists(s.run_dir("sweep") + "/output.txt"));  // the table, as the command prints it
  s.set_outcome(o);
  const PartResult& res = s.evaluate(s.lesson().main);
  for (const CheckResult& c : res.checks) EXPECT_TRUE(c.passed) << c.id << ": " << c.error;
  std::map<std::string, Value> q(res.quantities.begin(), res.quantities.end());
  const uint64_t m16 = 16u << 20;
  // exactly the simulator's numbers (the JSON keeps every double's digits)
  EXPECT_EQ(q.at("bw_16").number, simulated(2, lab::SimAlgorithm::Ring, m16).busbw / 1e9);
  EXPECT_EQ(q.at("bw_1024").number, simulated(128, lab::SimAlgorithm::Ring, m16).busbw / 1e9);
  EXPECT_EQ(q.at("lat_1024").number, simulated(128, lab::SimAlgorithm::Ring, m16).latency_s * 1e6);
  ASSERT_TRUE(q.at("ring_lats").is_tensor());  // 2, 16, 128 nodes, in the file's order
  ASSERT_EQ(q.at("ring_lats").tensor.size(), 3u);
  EXPECT_EQ(q.at("ring_lats").tensor[0], simulated(2, lab::SimAlgorithm::Ring, m16).latency_s * 1e6);
  EXPECT_EQ(q.at("ring_lats").tensor[2], q.at("lat_1024").number);
  // the tree is the faster one on 16 and 128 nodes at both sizes, and on 2 nodes at 1 MiB
  int tree_faster = 0;
  for (int n : {2, 16, 128})
    for (uint64_t b : {uint64_t{1} << 20, m16})
      tree_faster += simulated(n, lab::SimAlgorithm::DbTree, b).time_s < simulated(n, lab::SimAlgorithm::Ring, b).time_s;
  EXPECT_EQ(q.at("tree_wins").number, tree_faster);
  EXPECT_EQ(q.at("tree_wins_too").number, tree_faster);  // booleans sum as 1 and 0
  EXPECT_EQ(q.at("nccl_trees").number, 4);               // NCCL's model: the tree at both sizes on 16 and 128 nodes
  EXPECT_EQ(q.at("nowhere").number, 0);                  // count: nothing matches is 0, not an error
  EXPECT_EQ(q.at("smallest").number, 1048576);
  ASSERT_TRUE(q.at("pick").is_string());
  EXPECT_TRUE(contains(q.at("pick").text, "tree/")) << q.at("pick").text;
  // computed, not timed: its checks are judged on every machine
  for (const QuantitySpec& spec : s.lesson().main.quantities)
    EXPECT_FALSE(is_timing_quantity(s.lesson(), s.lesson().main, spec)) << spec.name;
  EXPECT_TRUE(contains(res.explanation, " GB/s")) << res.explanation;
}

// field and where over an array of objects, with what each mistake says.
TEST(LessonSimulate, FieldAndWhereSelectElements) {
  testutil::TempDir d;
  testutil::write_file(d.file("result.json"), R"({"points": [
    {"algorithm": "ring", "ranks": 16, "bytes": 1024, "busbw_GBps": 10.5, "fastest": false, "nccl_choice": "tree/LL"},
    {"algorithm": "dbtree", "ranks": 16, "bytes": 1024, "busbw_GBps": 20.0, "fastest": true, "nccl_choice": "tree/LL"},
    {"algorithm": "ring", "ranks": 32, "bytes": 1024, "busbw_GBps": 5.25, "fastest": true, "nccl_choice": "ring/LL128"},
    {"algorithm": "dbtree", "ranks": 32, "bytes": 1024, "busbw_GBps": 4.0, "fastest": false, "nccl_choice": "ring/LL128"}],
    "about": {"n": 1}})");
  RunOutcome o;
  o.name = "s";
  o.dir = d.path();
  QuantitySpec q;
  q.name = "x";
  q.source = "result";
  q.path = "/points";
  q.field = "busbw_GBps";
  auto term = [](const std::string& key, std::vector<nlohmann::json> values) {
    WhereTerm t;
    t.key = key;
    t.values = std::move(values);
    return t;
  };
  RunFiles files;
  auto error_of = [&](const QuantitySpec& spec) -> std::string {
    try {
      files.read(spec, o);
    } catch (const QuantityError& e) {
      return e.what();
    }
    return "(no error)";
  };
  q.where = {term("algorithm", {"ring"}), term("ranks", {32})};
  EXPECT_EQ(files.read(q, o).number, 5.25);
  q.where = {term("nccl_choice", {"tree/*"}), term("fastest", {true})};  // a glob, a boolean
  EXPECT_EQ(files.read(q, o).number, 20.0);
  q.where = {term("ranks", {16, 32}), term("algorithm", {"ring"})};  // any of several
  q.reduce = "series";
  const Value series = files.read(q, o);
  ASSERT_TRUE(series.is_tensor());
  EXPECT_EQ(series.tensor, (std::vector<double>{10.5, 5.25}));
  q.reduce = "max";
  EXPECT_EQ(files.read(q, o).number, 10.5);
  q.field = "fastest";  // a boolean: one value is a boolean, a numeric reduction counts it as 1 or 0
  q.reduce = "sum";
  EXPECT_EQ(files.read(q, o).number, 1);
  q.reduce = "";
  q.where = {term("ranks", {32}), term("algorithm", {"ring"})};
  EXPECT_TRUE(files.read(q, o).is_bool());
  q.field = "busbw_GBps";

  q.where = {term("algorithm", {"ring"})};  // two match, no reduce
  EXPECT_TRUE(contains(error_of(q), "2 elements match where algorithm = \"ring\": narrow where, or add reduce")) << error_of(q);
  q.where = {term("ranks", {1000})};  // none: what is there
  EXPECT_TRUE(contains(error_of(q), "no element matches where ranks = 1000 (there: ranks: 16, 32)")) << error_of(q);
  q.reduce = "count";
  EXPECT_EQ(files.read(q, o).number, 0);
  q.reduce = "min";
  EXPECT_TRUE(contains(error_of(q), "reduce = \"count\" would be 0")) << error_of(q);
  q.reduce = "";
  q.where = {term("algoritm", {"ring"})};  // a misspelt key is not a filter that matches nothing
  EXPECT_TRUE(contains(error_of(q), "no element has a field 'algoritm' (fields: algorithm, busbw_GBps")) << error_of(q);
  q.where = {term("algorithm", {"ring"}), term("ranks", {16})};
  q.field = "busbw";
  EXPECT_TRUE(contains(error_of(q), "no element has a field 'busbw'")) << error_of(q);
  q.field = "busbw_GBps";
  q.path = "/about";
  EXPECT_TRUE(contains(error_of(q), "field and where read an array of objects")) << error_of(q);
}

// A simulate run's flags are dtlab simulate's, checked as it checks them: a bad value is named
// with the lesson file's line and the flag, before anything runs.
TEST(LessonSimulate, BadArgsAreRefusedWithTheFileAndTheFlag) {
  auto first = [](const std::string& text) {
    const auto p = problems(text, "lessons/sim.toml");
    return p.empty() ? std::string() : p[0].format();
  };
  const std::string args = "args = \"--topology dgx-h100 --nodes 2,16,128 --collective allreduce --algorithm ring,dbtree --sizes 1M,16M\"";
  auto with = [&](const std::string& a) { return replace(kSim, args, "args = \"" + a + "\""); };
  EXPECT_NO_THROW(parse_lesson(kSim, "lessons/sim.toml"));
  std::string m = first(with("--nodes 1,3,...,512"));
  EXPECT_TRUE(contains(m, "lessons/sim.toml:26:7: run 'sweep': dtlab simulate --nodes 1,3,...,512: --nodes 1,3,...,512: 512 is not on "
                          "the progression")) << m;
  m = first(with("--sizes 16Q"));
  EXPECT_TRUE(contains(m, "lessons/sim.toml:26:7:") && contains(m, "--sizes 16Q: '16Q': unknown unit 'Q'")) << m;
  m = first(with("--topology dgx-h1000"));
  EXPECT_TRUE(contains(m, "--topology dgx-h1000: not a preset")) << m;
  m = first(with("--collective alltoall"));
  EXPECT_TRUE(contains(m, "--collective")) << m;
  m = first(with("--algorithm tree"));
  EXPECT_TRUE(contains(m, "--algorithm")) << m;
  m = first(with("--collective allgather --algorithm ring,dbtree"));
  EXPECT_TRUE(contains(m, "--algorithm dbtree with --collective allgather: NCCL's tree runs allreduce only")) << m;
  m = first(with("--nodes 2 --channels x"));
  EXPECT_TRUE(contains(m, "--channels")) << m;
  m = first(with("--nodse 2"));
  EXPECT_TRUE(contains(m, "unknown flag --nodse (did you mean --nodes?)")) << m;
  m = first(with("--nodes 2 --json out.json"));
  EXPECT_TRUE(contains(m, "run 'sweep': drop --json")) << m;
  m = first(with("--validate nccl"));
  EXPECT_TRUE(contains(m, "run 'sweep': drop --validate")) << m;
  // --step's flags, as dtlab simulate --step checks them before it reads anything
  const std::string step = "--topology dgx-h100 --nodes 1,2 --step --gpu-tflops 100";
  EXPECT_NO_THROW(parse_lesson(with(step), "lessons/sim.toml"));
  m = first(with(step + " --mode zeroo"));
  EXPECT_TRUE(contains(m, "lessons/sim.toml:26:7:") && contains(m, "--mode zeroo: one of ddp, zero, fsdp, pipeline, tensor")) << m;
  m = first(with(step + " --mode pipeline"));
  EXPECT_TRUE(contains(m, "--mode pipeline needs --pp P")) << m;
  m = first(with(step + " --layouts some"));
  EXPECT_TRUE(contains(m, "--layouts some: all")) << m;
  m = first(with(step + " --model resnet"));
  EXPECT_TRUE(contains(m, "resnet")) << m;
  m = first(with("--topology dgx-h100 --nodes 1,2 --step"));
  EXPECT_TRUE(contains(m, "--step needs the compute")) << m;
  m = first(with("--topology dgx-h100 --nodes 1,2 --gpu-tflops 100"));
  EXPECT_TRUE(contains(m, "--gpu-tflops is a flag of dtlab simulate --step")) << m;

  // and on the command line: the file, the line, the flag; exit 2
  testutil::TempDir dir;
  const std::string path = write_lesson(dir, with("--nodes 1,3,...,512"), "sim.toml");
  const auto r = testutil::run_cli("lesson check " + path);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, path + ":26:7: run 'sweep':") && contains(r.out, "--nodes 1,3,...,512")) << r.out;
  // a lesson run refuses it before anything runs
  const auto run = testutil::run_cli("lesson run " + path + " --answers auto --out " + dir.file("out"));
  EXPECT_EQ(run.exit_code, 2) << run.out;
  EXPECT_TRUE(contains(run.out, "--nodes 1,3,...,512")) << run.out;
}

// What field, where and the scale view accept.
TEST(LessonSimulate, FieldWhereAndTheScaleViewAreChecked) {
  auto all = [](const std::string& text) {
    std::string out;
    for (const Diagnostic& d : problems(text, "lessons/sim.toml")) out += d.format() + "\n";
    return out;
  };
  const std::string line = "tree_wins = { run = \"sweep\", result = \"/points\", where = { algorithm = \"dbtree\", fastest = true }, reduce = \"count\" }";
  auto with = [&](const std::string& q) { return replace(kSim, line, q); };
  std::string m = all(with("tree_wins = { run = \"sweep\", result = \"/points\", where = { algorithm = \"dbtree\" } }"));
  EXPECT_TRUE(contains(m, "where selects elements of the array at the pointer: name the field to read")) << m;
  m = all(with("tree_wins = { run = \"sweep\", result = \"/points\", where = { algorithm = { a = 1 } }, field = \"bytes\" }"));
  EXPECT_TRUE(contains(m, "where.algorithm must be a number, a string")) << m;
  m = all(with("tree_wins = { run = \"sweep\", result = \"/points\", where = { algorithm = [] }, field = \"bytes\" }"));
  EXPECT_TRUE(contains(m, "where.algorithm = [] matches nothing")) << m;
  m = all(with("tree_wins = { run = \"sweep\", result = \"/points\", field = \"bytes\", reduce = \"median\" }"));
  EXPECT_TRUE(contains(m, "unknown reduce 'median'")) << m;
  m = all(with("tree_wins = { run = \"sweep\", result = \"/points\", reduce = \"max\" }"));
  EXPECT_TRUE(contains(m, "takes only reduce = \"count\"") && contains(m, "with field")) << m;
  m = all(with("tree_wins = { run = \"sweep\", result = \"/points\", field = \"/bytes\" }"));
  EXPECT_TRUE(contains(m, "field names a field of each element")) << m;
  m = all(with("tree_wins = { expr = \"1\", field = \"bytes\" }"));
  EXPECT_TRUE(contains(m, "'field' reads an array of objects in a summary or result quantity, not expr")) << m;
  m = all(with("tree_wins = { run = \"sweep\", summary = \"/points\", field = \"bytes\", reduce = \"count\" }"));
  EXPECT_TRUE(contains(m, "summary comes from a training run's directory; run 'sweep' is `dtlab simulate`")) << m;
  // the scale view shows simulate runs, and a simulate run no other view
  const std::string obs = "\n[[observe]]\nrun = \"sweep\"\nview = \"scale\"\nsay = \"{bw_1024:.2f} GB/s at 1,024 GPUs\"\n";
  EXPECT_NO_THROW(parse_lesson(std::string(kSim) + obs, "lessons/sim.toml"));
  m = all(std::string(kSim) + replace(obs, "view = \"scale\"", "view = \"ring\""));
  EXPECT_TRUE(contains(m, "the app's views show training runs") && contains(m, "view = \"scale\" simulate results")) << m;
  m = all(std::string(kSim) + replace(obs, "view = \"scale\"", "view = \"scale\"\nstep = 1"));
  EXPECT_TRUE(contains(m, "the scale view shows a finished simulation")) << m;
  m = all(replace(kGood, "[[check]]", "[[observe]]\nrun = \"dropped\"\nview = \"scale\"\nsay = \"x\"\n\n[[check]]"));
  EXPECT_TRUE(contains(m, "run 'dropped' is `dtlab run`: the scale view shows `dtlab simulate` results")) << m;
}
