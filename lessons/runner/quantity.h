// Reading a lesson's quantities from what its runs left behind: the run directory (summary.json,
// metrics.jsonl, config.toml, weights files), a bench or eval command's JSON result, and how the
// run ended (exit code, error text). lessons/README.md lists every source, filter and reduction.
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "expr.h"
#include "lesson.h"

namespace lessons {

// How one run ended. Written next to the run's own files as outcome.json, so that a prepared
// run (dtlab lesson prepare) is complete without being run again.
struct RunOutcome {
  std::string name;
  std::string command;              // "run", "bench allreduce", ...
  std::vector<std::string> args;    // concrete: placeholders replaced, --out/--json added
  std::string dir;                  // the run's directory
  int exit_code = 0;
  std::string error, hint;          // the error dtlab would print (empty when it succeeded)
  double seconds = 0;
  bool prepared = false;            // replayed from a prepared folder, not run now

  std::string command_line() const;  // "dtlab run --model mlp ... --out DIR"
  nlohmann::json to_json() const;
  static RunOutcome from_json(const nlohmann::json& j, const std::string& dir);
};
void write_outcome(const RunOutcome& o);            // <dir>/outcome.json
RunOutcome read_outcome(const std::string& dir);    // throws lab::IoError naming the file

// A quantity that cannot be read: the message names the run, the file and what is missing.
class QuantityError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parsed files of the runs, loaded once however many quantities read them.
class RunFiles {
 public:
  // Reads quantity q (any source but expr) of the run that ended as `outcome`.
  Value read(const QuantitySpec& q, const RunOutcome& outcome);

 private:
  const nlohmann::json& json_file(const std::string& path);
  // field and where of a summary or result quantity: the field of the elements of `arr` that
  // where selects, one value, or several reduced (QuantitySpec::reduce).
  static Value select_elements(const nlohmann::json& arr, const QuantitySpec& q, const std::string& where);
  const std::vector<nlohmann::json>& metrics(const std::string& dir);
  // bn_stats.bin of a run directory as metrics "bn" arrays: [step] -> [rank] -> the record's "bn"
  const std::map<int64_t, std::vector<nlohmann::json>>* bn_stats(const std::string& dir);
  std::map<std::string, nlohmann::json> m_json;
  std::map<std::string, std::vector<nlohmann::json>> m_metrics;
  std::map<std::string, std::map<int64_t, std::vector<nlohmann::json>>> m_bn;
};

// A JSON value as an expression value: numbers, booleans, strings; arrays of numbers (nested
// arrays are flattened, row by row) become tensors. Throws QuantityError for objects, null and
// mixed arrays.
Value json_to_value(const nlohmann::json& j, const std::string& where);

}  // namespace lessons
