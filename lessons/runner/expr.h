// The lesson expression language: the small, non-scripting language of a lesson's checks,
// choice predicates, numeric answers and derived quantities (lessons/README.md documents it for
// authors). It has values, arithmetic, comparisons, `and`/`or`/`not` and a fixed set of functions;
// no assignment, loops or user-defined functions, so a lesson cannot do anything but compare
// what the lab measured.
//
//   approx(sync_loss, global_loss, rtol=1e-5) and local_spread > 100 * sync_spread
//   max_abs_diff(w_ring, w_tree) < 1e-4 and not bitwise_equal(w_ring, w_tree)
//   contains(error, "Expected more than 1 value per channel")
//
// Grammar (lowest precedence first):
//   expr    := or
//   or      := and ('or' and)*
//   and     := not ('and' not)*
//   not     := 'not' not | cmp
//   cmp     := sum (('<' | '<=' | '>' | '>=' | '==' | '!=') sum)?      no chains: a < b < c is an error
//   sum     := prod (('+' | '-') prod)*
//   prod    := unary (('*' | '/') unary)*
//   unary   := '-' unary | atom
//   atom    := NUMBER | STRING | 'true' | 'false' | NAME | NAME '(' [arg (',' arg)*] ')' | '(' expr ')'
//   arg     := expr | NAME '=' expr                                    keyword arguments come last
//   NUMBER  := 12 | 1.5 | .5 | 1e-5 | 2.5E+3
//   STRING  := "..." or '...' with \" \' \\ \n escapes
//   NAME    := [A-Za-z_][A-Za-z0-9_.]*        a quantity (dots allowed: variation.ratio)
//
// Values are numbers (double), booleans, strings and tensors (a flat list of doubles: a weights
// tensor, a BatchNorm statistic per channel, a series over steps). Arithmetic is elementwise on
// tensors of equal length, and a number combines with every element of a tensor. Comparisons take
// two numbers (or two strings, with == and != only); a tensor in a comparison is an error whose
// message suggests max(), min() or approx(). `and`, `or` and `not` take booleans and
// short-circuit. Division by zero follows IEEE (inf, nan); every comparison with nan is false.
//
// Functions (checked at parse time: an unknown function or a wrong number of arguments is a
// parse error):
//   approx(a, b, rtol=1e-5, atol=1e-8)  every |a - b| <= atol + rtol * |b| (numpy.allclose); bool
//   max_abs_diff(a, b)                  max |a - b| over elements; number
//   rel_diff(a, b)                      max |a - b| / max |b| (0 when both are all zero); number
//   bitwise_equal(a, b)                 same length and every element the same bits; bool
//   abs(x) sqrt(x) log(x) log2(x) exp(x) floor(x) ceil(x) round(x)   elementwise
//   min(t) max(t) mean(t) sum(t) std(t) spread(t) norm(t)   over a tensor's elements (std: the
//                                       population standard deviation; spread: max - min;
//                                       norm: L2); a number counts as a one-element tensor
//   min(a, b, ...) max(a, b, ...)       with two or more arguments: of numbers
//   len(t)                              number of elements (1 for a number)
//   at(t, i)                            element i (0-based; negative counts from the end)
//   first(t) last(t)                    at(t, 0), at(t, -1)
//   diff(t)                             consecutive differences t[i+1] - t[i] (len(t) - 1 values):
//                                       what each step added to a running total
//   contains(s, sub)                    substring test on strings; bool
//   if(cond, a, b)                      a when cond is true, else b (only the chosen one is evaluated)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace lessons {

struct Value {
  enum class Kind { Number, Bool, String, Tensor };
  Kind kind = Kind::Number;
  double number = 0;
  bool boolean = false;
  std::string text;
  std::vector<double> tensor;

  static Value num(double v);
  static Value boolean_(bool v);
  static Value str(std::string s);
  static Value tens(std::vector<double> t);

  bool is_number() const { return kind == Kind::Number; }
  bool is_bool() const { return kind == Kind::Bool; }
  bool is_string() const { return kind == Kind::String; }
  bool is_tensor() const { return kind == Kind::Tensor; }
  // "number", "boolean", "string", "tensor of N values"
  std::string type_name() const;
  // For messages and records: numbers with %.6g, booleans true/false, strings as they are,
  // tensors as "[v0, v1, v2, ... vN-1] (N values)" with at most 6 values shown.
  std::string to_string() const;
};

// A parse or evaluation error. `offset` is the 0-based character offset in the expression text
// where the problem starts (parse errors; -1 when it has no place, e.g. most evaluation errors).
class ExprError : public std::runtime_error {
 public:
  ExprError(const std::string& what, int offset = -1) : std::runtime_error(what), m_offset(offset) {}
  int offset() const { return m_offset; }

 private:
  int m_offset;
};

struct ExprNode;

// A parsed expression; cheap to copy (the tree is shared and immutable).
class Expr {
 public:
  Expr() = default;
  // Throws ExprError with the offset of the offending token, e.g. "unknown function 'aprox'",
  // "approx() takes 2 arguments and the keywords rtol, atol", "expected ')'".
  static Expr parse(const std::string& text);

  const std::string& text() const { return m_text; }
  bool empty() const { return !m_root; }
  // The quantity names it refers to, each once, in order of first appearance, with the offset of
  // that appearance (so a lint can point at an unknown name).
  std::vector<std::pair<std::string, int>> names() const;

  // Looks up a name's value; returns nullptr for an unknown name (an ExprError names it).
  using Lookup = std::function<const Value*(const std::string& name)>;
  // Throws ExprError for type errors ("'>' needs two numbers, got a tensor of 10 values on the
  // left: compare max(...) or use approx()"), unknown names, tensors of different lengths, an
  // index out of range.
  Value eval(const Lookup& lookup) const;
  // eval() that must give a boolean (a check or a predicate); throws ExprError otherwise.
  bool eval_bool(const Lookup& lookup) const;
  // eval() that must give a number (a numeric answer); throws ExprError otherwise.
  double eval_number(const Lookup& lookup) const;

 private:
  std::string m_text;
  std::shared_ptr<const ExprNode> m_root;
};

}  // namespace lessons
