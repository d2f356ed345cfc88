// Lesson: one lesson file (lessons/<id>.toml) read and checked. A lesson is a question, the
// learner's predictions (locked before anything runs), the runs that answer it (dtlab commands),
// quantities measured from those runs, what to observe in the app, checks that verify the
// lesson's claim, hints, an explanation whose numbers come from the runs, follow-up variations and
// notes for the teacher. lessons/README.md is the authoring guide; this header is its contract.
//
// load_lesson() reads and lints in one pass and reports every problem it finds as
// `file:line:col: message` (the line and column of the key or value at fault): TOML syntax,
// unknown keys, wrong types, missing keys, a run flag that `dtlab run` would refuse (parsed by the
// CLI's own definitions, commands/command_line.h), a name that is not a quantity, a prediction
// without a rule for being right, a prediction without a hint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"
#include "errors.h"
#include "expr.h"

namespace lessons {

constexpr int kLessonFormatVersion = 1;

struct SourcePos {
  int line = 0, col = 0;  // 1-based; 0: unknown
};

struct Diagnostic {
  std::string file;
  SourcePos pos;
  std::string message;
  std::string format() const;  // "file:line:col: message"
};

// A lesson file that cannot be used: every diagnostic, in file order. Exit code 2 (a bad input,
// like a bad flag).
class LessonError : public lab::ConfigError {
 public:
  LessonError(const std::string& file, std::vector<Diagnostic> diagnostics);
  const std::vector<Diagnostic>& diagnostics() const { return m_diagnostics; }

 private:
  std::vector<Diagnostic> m_diagnostics;
};

// ---- the parts of a lesson ----

struct Choice {
  std::string key;            // "a", "b", ... what the learner answers
  std::string text;
  std::string misconception;  // what choosing it usually means (shown with the result)
  Expr correct_if;            // a predicate over measured quantities
  SourcePos pos;
};

struct Prediction {
  std::string id;
  std::string kind;           // "choice" | "numeric"
  std::string prompt;
  std::vector<Choice> choices;               // choice
  Expr answer;                               // numeric: the measured value to compare with
  double rtol = 0, atol = 0;                 // numeric: right when |guess - answer| <= atol + rtol |answer|
  std::string unit;                          // numeric
  bool ask_why = false;                      // ask for a one-line reason (kept in the record)
  bool confidence = true;                    // ask how sure (1-5)
  SourcePos pos;
};

struct RunSpec {
  std::string name;
  std::string command = "run";     // one of commands::lesson_commands()
  std::string args_text;           // as written (with {run:NAME} placeholders)
  std::string base;                // run whose args come first
  std::vector<std::string> args;   // resolved: base's args, then these (placeholders kept)
  std::vector<std::string> after;  // runs it reads ({run:NAME}): they run first
  int expect_exit = 0;             // the exit code the run must end with
  std::string expect_error;        // ... and text its error must contain (when expect_exit != 0)
  SourcePos pos;
  commands::CommandSpec parsed;    // the options as the CLI parses them (placeholders replaced by
                                   // a stand-in directory)
};

// One condition of a quantity's `where` (summary and result quantities over an array of objects,
// e.g. a simulate run's points): an element matches when its field `key` (a dotted path for
// nested objects) equals one of `values`: a number the same number, a string as a glob (`*`, `?`:
// "tree/*"), a boolean the same boolean.
struct WhereTerm {
  std::string key;
  std::vector<nlohmann::json> values;  // one, or several written as an array (any of them)
  SourcePos pos;
};

struct QuantitySpec {
  std::string name;
  std::string run;                 // the run it is read from (empty for expr)
  std::string source;              // summary | metrics | trace | tensor | result | config | exit_code | error | expr
  std::string path;                // summary/result: JSON pointer; metrics: field; trace, tensor: name or glob; config: key
  std::string file = "final.safetensors";  // tensor: the weights file in the run directory
  std::optional<int64_t> rank;     // metrics, trace: filter; tensor: that rank's own files overlay final.safetensors
  std::string kind = "step";       // metrics: step | epoch | eval
  std::optional<int64_t> step;     // metrics, trace filter; -1 (metrics only): the last step recorded
  std::optional<int64_t> epoch;    // metrics filter
  std::string layer;               // metrics bn.*: the BatchNorm layer ("2" in "2.running_mean")
  std::optional<int64_t> channel;  // metrics bn.*: one channel instead of the whole array
  std::string reduce;              // metrics, trace, and summary/result with field: last first mean sum min max
                                   // spread std count series; summary/result without field: count only
  std::string field;               // summary/result: the pointer names an array of objects; read this field
                                   // (a dotted path) of each element that `where` selects
  std::vector<WhereTerm> where;    // summary/result: which elements of that array (all conditions hold)
  Expr expr;                       // expr
  std::string what, unit;          // for people: shown next to the value
  SourcePos pos;
};

// What the scale view can show (viz/data/scale_data.h's kScaleMaxNodes, kScaleMinBytes and
// kScaleMaxBytes; test_viz_scale.cpp checks that they agree): an observation's `nodes` is a power of
// two up to this, its `size` a power of two in this range.
constexpr int64_t kScaleViewMaxNodes = 512;
constexpr uint64_t kScaleViewMinBytes = uint64_t{1} << 10;
constexpr uint64_t kScaleViewMaxBytes = uint64_t{8} << 30;

struct Observe {
  std::vector<std::string> runs;   // one run, or two shown side by side (twins)
  std::string view;                // ring | batchnorm | batching | traineval | bench (bench train / chain runs) | memory
                                   // | pipeline | scale (simulate runs)
  std::string layer;               // batchnorm view: the BatchNorm layer ("2")
  int64_t channel = -1;            // batchnorm view: the channel
  int64_t step = -1;               // the iteration to look at: the run pauses when it is done (-1: the end)
  int ring_step = -1;              // ... or this many ring steps into its gradient allreduce
  int64_t nodes = -1;              // scale view: the node count N the observation is about (-1: the run's)
  uint64_t bytes = 0;              // scale view: the size S, from `size` ("16M" or bytes; 0: the run's)
  std::string say;                 // what to look at ({quantity:fmt} placeholders allowed)
  SourcePos pos, say_pos, nodes_pos, size_pos;
};

struct Check {
  std::string id;
  Expr that;
  std::string why;                 // the claim it verifies, in words
  // A check that reads a measured time (is_timing_quantity) says which kind of claim it is:
  //   timing = true: a claim about speed, judged only when the measurement can say it: quiet_if
  //     holds (e.g. the benchmark's rounds agree within a few percent) and, in a lesson that
  //     requires 2-cores, two cores are still idle after the runs. Otherwise it is "not judged"
  //     with the reason (never a failure); a lesson with a check not judged and none failed
  //     ends skipped (exit 77).
  //   timing = false: an identity or a bound that holds however fast or slow the machine ran
  //     (busbw = 2(N-1)/N algbw; a simulated link's time is at least what it models).
  bool timing = false;
  bool timing_given = false;       // the file says timing = true or false
  Expr quiet_if;                   // timing = true: when the measurement is quiet enough to judge
  SourcePos pos;
};

struct Hint {
  std::string prediction;          // shown after a wrong answer to this prediction (empty: any)
  std::string text;
  SourcePos pos, text_pos;
};

// The main part of a lesson and each variation share this shape.
struct Part {
  std::string id;                  // "main" or the variation's id
  std::string title;               // variation: its title
  std::string text;                // variation: the new situation, in words
  std::vector<Prediction> predictions;
  std::vector<RunSpec> runs;       // execution order (declaration order, readers after what they read)
  std::vector<QuantitySpec> quantities;
  std::vector<Observe> observe;
  std::vector<Check> checks;
  std::vector<Hint> hints;
  std::string explain;             // with {expression:format} placeholders
  SourcePos explain_pos;           // where its text starts
  SourcePos pos;
};

struct Teacher {
  std::string notes;
  std::string expected_first_vote;
  std::vector<std::string> pitfalls;
};

// A claim a lesson makes about PyTorch, checked against PyTorch ([[torch_check]]): a script that
// runs the same situation in python3-torch 1.13 and exits 0 when PyTorch does what the claim says
// (1 when not, 77 without torch), or a citation of the PyTorch 1.13 source the claim rests on.
struct TorchCheck {
  std::string id;
  std::string claim;               // what PyTorch does, in the lesson's words
  std::string script;              // relative to the lesson file's folder ("torch/bn_ddp.py"), or ""
  std::string cite;                // or: PyTorch 1.13's file and function, and what it shows
  SourcePos pos;
};

// The lab made wrong in one respect ([[mutation]]), and the lesson's checks that must then fail:
// proof that those checks test what they claim (`dtlab lesson mutate`). A lab mutation
// (lab/core/mutation.h) switches on a deliberately wrong behaviour; args are appended to the
// lesson's runs (e.g. a flag that turns the claimed mechanism off).
struct Mutation {
  std::string id;
  std::string what;                // what is wrong, in words
  std::string lab;                 // a known lab mutation, or ""
  std::vector<std::string> args;   // flags appended to the runs
  std::vector<std::string> runs;   // the runs they apply to (empty: every `run` command)
  std::vector<std::string> breaks; // ids of checks (in any part) that must fail
  // timing = true: the fault shows only in wall-clock time (a check of a bound that a slow
  // machine's own overhead also meets cannot tell it apart), so `lesson mutate` judges it only
  // when other programs took less than kMutationQuietCores while its runs ran.
  bool timing = false;
  SourcePos pos;
};
// Cores' worth of CPU time other programs may take while a timing mutation runs for it to be judged.
constexpr double kMutationQuietCores = 0.25;

struct Lesson {
  std::string file;                // the path it was read from
  int format_version = kLessonFormatVersion;
  std::string id;
  int version = 1;
  std::string title;
  std::string question_source;
  double minutes = 0;              // class time
  double budget_s = 0;             // time the lesson's runs may take on 2 cores (its ctest timeout)
  std::vector<std::string> requires_;  // mpi | cuda | full-dataset | 2-cores
  std::vector<std::string> tags;
  std::string suite = "lesson";    // ctest label: lesson (default) or long
  std::string question;            // [question] text, in the asker's words
  std::string context;
  Part main;
  std::vector<Part> variations;
  Teacher teacher;
  std::vector<TorchCheck> torch_checks;
  std::vector<Mutation> mutations;

  // Every part in order: main, then the variations.
  std::vector<const Part*> parts() const;
  const RunSpec* find_run(const std::string& name) const;  // in any part
  const QuantitySpec* find_quantity(const std::string& name) const;
  // The quantity `name` as part p sees it: its own, else the main part's (nullptr: neither).
  const QuantitySpec* visible_quantity(const Part& p, const std::string& name) const;
};

// The runs that checks (by id, in any part) read: through their quantities, expr quantities
// followed, with the runs those runs read ({run:NAME}); in the lesson's order. What must run to
// judge only those checks (`dtlab lesson mutate`).
std::vector<std::string> runs_read_by_checks(const Lesson& l, const std::vector<std::string>& check_ids);

// Reads and checks a lesson file. Throws LessonError with every problem found.
Lesson load_lesson(const std::string& path);
// Reads and checks lesson text (path is only used in messages). Throws LessonError.
Lesson parse_lesson(const std::string& text, const std::string& path);

// The placeholders of an explanation or observe text: "{expr}" or "{expr:format}" ("{{" and
// "}}" are literal braces). Format: Python's mini-language for numbers: [,][.precision][f|e|g|%|d],
// e.g. ".3g", ",.0f", ".1%". Throws ExprError (offset into text) for a bad placeholder.
struct Placeholder {
  size_t begin = 0, end = 0;       // [begin, end) in the text, braces included
  Expr expr;
  std::string format;
};
std::vector<Placeholder> find_placeholders(const std::string& text);
// Formats a value with a placeholder's format (numbers; other values ignore it).
std::string format_value(const Value& v, const std::string& format);

// Text as written in a lesson's multi-line strings, reflowed for a display that wraps: lines of a
// paragraph joined by spaces, paragraphs (blank lines) kept, and lines that start with "- " or two
// spaces kept on their own.
std::string reflow(const std::string& text);

// What `requires` may name, and whether this build and machine has it (mpi: the MPI transport and
// mpirun; cuda: a CUDA device; full-dataset: the whole Fashion-MNIST installed; 2-cores: two cores
// this process may use, idle now, measured: machine.h). Returns "" when available, else why not.
std::string missing_requirement(const std::string& what);
const std::vector<std::string>& known_requirements();

// Whether a quantity is a measured time, or computed from one (then the checks that read it say
// timing = true or false): metrics "t"; summary and result pointers whose last key is a time, a
// rate or a ratio of times (train_seconds, samples_per_s, step_ms, time_us, gflops, busbw_gbps,
// scaling, hidden_fraction, noise, ...), or whose field is one; an expr quantity that reads one.
// Never a `simulate` run's result: the simulator computes its times, nothing is timed.
bool is_timing_quantity(const Lesson& l, const Part& p, const QuantitySpec& q);

}  // namespace lessons
