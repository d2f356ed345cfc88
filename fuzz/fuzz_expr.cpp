// Fuzzes the lesson expression language (lessons/runner/expr.h) and the placeholders of a
// lesson's explanation and observe texts (lesson.h: find_placeholders, format_value): the input is
// one expression, parsed and evaluated against a few quantities of every kind, and also read as a
// text with {expr:format} placeholders, each evaluated and formatted.
// Expected errors: lessons::ExprError (parse and evaluation). Anything else is a finding.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "expr.h"
#include "lesson.h"

namespace {

using lessons::Value;

// Names an expression may use: numbers (NaN, infinity and zero among them), booleans, strings, and
// tensors (empty, short, long, with a NaN), with and without dots.
const std::map<std::string, Value>& quantities() {
  static const std::map<std::string, Value> q = [] {
    std::map<std::string, Value> m;
    m["a"] = Value::num(2.5);
    m["b"] = Value::num(-3);
    m["zero"] = Value::num(0);
    m["nan"] = Value::num(std::nan(""));
    m["inf"] = Value::num(INFINITY);
    m["big"] = Value::num(1e300);
    m["t"] = Value::tens({1, 2, 3});
    m["u"] = Value::tens({1, 2, 3.5});
    m["e"] = Value::tens({});
    m["n"] = Value::tens({0.5, std::nan(""), -1});
    std::vector<double> long_tensor(1000);
    for (size_t i = 0; i < long_tensor.size(); ++i) long_tensor[i] = static_cast<double>(i) * 0.25 - 7;
    m["w"] = Value::tens(long_tensor);
    m["s"] = Value::str("Expected more than 1 value per channel");
    m["f"] = Value::boolean_(false);
    m["yes"] = Value::boolean_(true);
    m["run.ratio"] = Value::num(0.75);
    return m;
  }();
  return q;
}

const Value* lookup(const std::string& name) {
  auto it = quantities().find(name);
  return it == quantities().end() ? nullptr : &it->second;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const lessons::Expr e = lessons::Expr::parse(text);
    (void)e.names();
    const Value v = e.eval(lookup);
    (void)v.to_string();
    (void)v.type_name();
    for (const char* format : {"", ".3g", ",.0f", ".1%", ".2e", "d", ".99f"}) (void)lessons::format_value(v, format);
  } catch (const lessons::ExprError&) {
  }
  try {
    for (const lessons::Placeholder& ph : lessons::find_placeholders(text)) {
      try {
        (void)lessons::format_value(ph.expr.eval(lookup), ph.format);
      } catch (const lessons::ExprError&) {
      }
    }
  } catch (const lessons::ExprError&) {
  }
  return 0;
}
