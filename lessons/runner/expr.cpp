// The lesson expression language (expr.h): a tokenizer, a recursive-descent parser that builds an
// immutable tree, and an evaluator that walks it. Everything an author can get wrong in the text
// (unknown function, wrong arity, a stray '=') is caught at parse time with the offset of the
// token, so a lesson lint finds it before any run; evaluation errors are about the values.
#include "expr.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace lessons {

namespace {

std::string format_number(double v) {
  char buf[32];
  // whole numbers (byte counts, steps) in full, so an exact check shows the integers it compared
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string count_values(size_t n) { return std::to_string(n) + (n == 1 ? " value" : " values"); }

}  // namespace

Value Value::num(double v) { Value r; r.kind = Kind::Number; r.number = v; return r; }
Value Value::boolean_(bool v) { Value r; r.kind = Kind::Bool; r.boolean = v; return r; }
Value Value::str(std::string s) { Value r; r.kind = Kind::String; r.text = std::move(s); return r; }
Value Value::tens(std::vector<double> t) { Value r; r.kind = Kind::Tensor; r.tensor = std::move(t); return r; }

std::string Value::type_name() const {
  switch (kind) {
    case Kind::Number: return "number";
    case Kind::Bool: return "boolean";
    case Kind::String: return "string";
    case Kind::Tensor: return "tensor of " + count_values(tensor.size());
  }
  return "value";
}

std::string Value::to_string() const {
  switch (kind) {
    case Kind::Number: return format_number(number);
    case Kind::Bool: return boolean ? "true" : "false";
    case Kind::String: return text;
    case Kind::Tensor: {
      // A weights tensor can have millions of values: show the first five and the last.
      const size_t n = tensor.size();
      std::string s = "[";
      for (size_t i = 0; i < n; ++i) {
        if (n > 6 && i == 5) {
          s += ", ... ";
          i = n - 1;
        } else if (i > 0) {
          s += ", ";
        }
        s += format_number(tensor[i]);
      }
      return s + "] (" + count_values(n) + ")";
    }
  }
  return "";
}

// One node of the tree. Children are shared and never change, so an Expr copies cheaply.
struct ExprNode {
  enum class Kind { Literal, Name, Negate, Not, Binary, Call };
  enum class Op { Or, And, Lt, Le, Gt, Ge, Eq, Ne, Add, Sub, Mul, Div };
  enum class Fn { Approx, MaxAbsDiff, RelDiff, BitwiseEqual, Abs, Sqrt, Log, Log2, Exp, Floor, Ceil, Round,
                  Min, Max, Mean, Sum, Std, Spread, Norm, Len, At, First, Last, Contains, If, Diff };

  Kind kind = Kind::Literal;
  int offset = 0;  // of the literal, name, operator or function name
  int depth = 1;   // of the subtree; bounded so that evaluation cannot overflow the stack
  Value literal;
  std::string name;
  Op op = Op::Add;
  Fn fn = Fn::Abs;
  std::vector<std::shared_ptr<const ExprNode>> args;  // operands or positional arguments, in order
  std::shared_ptr<const ExprNode> rtol, atol;         // approx() keywords; null when not given
};

namespace {

using Node = ExprNode;
using NodePtr = std::shared_ptr<const ExprNode>;
using Fn = ExprNode::Fn;
using Op = ExprNode::Op;

constexpr int kMaxDepth = 200;
constexpr int kAnyCount = 1 << 30;

struct Function {
  const char* name;
  Fn fn;
  int min_args, max_args;
  const char* takes;  // for the arity message: "abs() takes 1 argument"
};

constexpr Function kFunctions[] = {
    {"approx", Fn::Approx, 2, 2, "2 arguments and the keywords rtol, atol"},
    {"max_abs_diff", Fn::MaxAbsDiff, 2, 2, "2 arguments"},
    {"rel_diff", Fn::RelDiff, 2, 2, "2 arguments"},
    {"bitwise_equal", Fn::BitwiseEqual, 2, 2, "2 arguments"},
    {"abs", Fn::Abs, 1, 1, "1 argument"},       {"sqrt", Fn::Sqrt, 1, 1, "1 argument"},
    {"log", Fn::Log, 1, 1, "1 argument"},       {"log2", Fn::Log2, 1, 1, "1 argument"},
    {"exp", Fn::Exp, 1, 1, "1 argument"},       {"floor", Fn::Floor, 1, 1, "1 argument"},
    {"ceil", Fn::Ceil, 1, 1, "1 argument"},     {"round", Fn::Round, 1, 1, "1 argument"},
    {"min", Fn::Min, 1, kAnyCount, "1 argument (a tensor) or 2 or more numbers"},
    {"max", Fn::Max, 1, kAnyCount, "1 argument (a tensor) or 2 or more numbers"},
    {"mean", Fn::Mean, 1, 1, "1 argument"},     {"sum", Fn::Sum, 1, 1, "1 argument"},
    {"std", Fn::Std, 1, 1, "1 argument"},       {"spread", Fn::Spread, 1, 1, "1 argument"},
    {"norm", Fn::Norm, 1, 1, "1 argument"},     {"len", Fn::Len, 1, 1, "1 argument"},
    {"at", Fn::At, 2, 2, "2 arguments"},        {"first", Fn::First, 1, 1, "1 argument"},
    {"last", Fn::Last, 1, 1, "1 argument"},     {"contains", Fn::Contains, 2, 2, "2 arguments"},
    {"if", Fn::If, 3, 3, "3 arguments"},        {"diff", Fn::Diff, 1, 1, "1 argument"},
};

const Function* find_function(const std::string& name) {
  for (const Function& f : kFunctions)
    if (name == f.name) return &f;
  return nullptr;
}

std::string function_name(Fn fn) {
  for (const Function& f : kFunctions)
    if (f.fn == fn) return std::string(f.name) + "()";
  return "?()";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string unknown_function_message(const std::string& name) {
  const Function* best = nullptr;
  size_t best_distance = 3;  // a typo, not a different word
  for (const Function& f : kFunctions) {
    const size_t d = edit_distance(name, f.name);
    if (d < best_distance && d < name.size()) best = &f, best_distance = d;
  }
  if (best) return "unknown function '" + name + "' (did you mean " + best->name + "?)";
  std::string all;
  for (const Function& f : kFunctions) all += (all.empty() ? "" : ", ") + std::string(f.name);
  return "unknown function '" + name + "': the functions are " + all;
}

const char* op_text(Op op) {
  static const char* const kText[] = {"or", "and", "<", "<=", ">", ">=", "==", "!=", "+", "-", "*", "/"};
  return kText[static_cast<int>(op)];  // in the order of ExprNode::Op
}

// ---- Tokens

struct Token {
  enum class Kind { Number, String, Name, Symbol, End };
  Kind kind = Kind::End;
  int offset = 0;
  std::string text;  // the source text; for a string, its value with escapes resolved
  double number = 0;
};

// ASCII only, whatever the process's locale.
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c) || c == '.'; }

size_t scan_number(const std::string& s, size_t i, Token& tok) {
  const size_t start = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    if (j < s.size() && is_digit(s[j])) {
      i = j;
      while (i < s.size() && is_digit(s[i])) ++i;
    } else {
      ++i;  // "1e" or "1e+": the letter makes it malformed below
    }
  }
  // "2x", "1.2.3" and "1e" are a mistake, not a number followed by a name.
  size_t end = i;
  while (end < s.size() && is_name_char(s[end])) ++end;
  tok.text = s.substr(start, end - start);
  const auto parsed = std::from_chars(s.data() + start, s.data() + i, tok.number);
  if (end != i || parsed.ptr != s.data() + i)
    throw ExprError("malformed number '" + tok.text + "'", static_cast<int>(start));
  if (parsed.ec == std::errc::result_out_of_range)
    throw ExprError("number '" + tok.text + "' is out of range", static_cast<int>(start));
  return end;
}

size_t scan_string(const std::string& s, size_t i, Token& tok) {
  const size_t start = i;
  const char quote = s[i++];
  for (;;) {
    if (i >= s.size()) throw ExprError("unterminated string", static_cast<int>(start));
    const char c = s[i];
    if (c == quote) return i + 1;
    if (c == '\\') {
      if (i + 1 >= s.size()) throw ExprError("unterminated string", static_cast<int>(start));
      const char e = s[i + 1];
      if (e == '"' || e == '\'' || e == '\\') tok.text += e;
      else if (e == 'n') tok.text += '\n';
      else throw ExprError(std::string("unknown escape '\\") + e + "' in a string: use \\\" \\' \\\\ or \\n",
                           static_cast<int>(i));
      i += 2;
    } else {
      tok.text += c;
      ++i;
    }
  }
}

std::vector<Token> tokenize(const std::string& s) {
  // Longest first; operators from other languages that an author is likely to type come with what
  // to write instead.
  static const char* const kSymbols[][2] = {
      {"**", "'**' is not an operator: there is no power, write x * x"},
      {"^", "'^' is not an operator: there is no power, write x * x"},
      {"&&", "'&&' is not an operator: write 'and'"},
      {"||", "'||' is not an operator: write 'or'"},
      {"<=", nullptr}, {">=", nullptr}, {"==", nullptr}, {"!=", nullptr},
      {"!", "'!' is not an operator: write 'not'"},
      {"(", nullptr}, {")", nullptr}, {",", nullptr}, {"+", nullptr}, {"-", nullptr},
      {"*", nullptr}, {"/", nullptr}, {"<", nullptr}, {">", nullptr}, {"=", nullptr}};

  std::vector<Token> tokens;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    Token tok;
    tok.offset = static_cast<int>(i);
    if (is_digit(c) || (c == '.' && i + 1 < s.size() && is_digit(s[i + 1]))) {
      tok.kind = Token::Kind::Number;
      i = scan_number(s, i, tok);
    } else if (c == '"' || c == '\'') {
      tok.kind = Token::Kind::String;
      i = scan_string(s, i, tok);
    } else if (is_name_start(c)) {
      tok.kind = Token::Kind::Name;
      const size_t start = i;
      while (i < s.size() && is_name_char(s[i])) ++i;
      tok.text = s.substr(start, i - start);
    } else {
      tok.kind = Token::Kind::Symbol;
      for (const auto& [sym, mistake] : kSymbols) {
        if (s.compare(i, std::strlen(sym), sym) != 0) continue;
        if (mistake) throw ExprError(mistake, tok.offset);
        tok.text = sym;
        break;
      }
      if (tok.text.empty()) {
        // Show a whole UTF-8 character (a pasted '≤' or curly quote), not its first byte.
        size_t len = 1;
        while (i + len < s.size() && (static_cast<unsigned char>(s[i + len]) & 0xC0) == 0x80) ++len;
        throw ExprError("unexpected character '" + s.substr(i, len) + "'", tok.offset);
      }
      i += tok.text.size();
    }
    tokens.push_back(std::move(tok));
  }
  Token end;
  end.offset = static_cast<int>(s.size());
  tokens.push_back(end);
  return tokens;
}

// ---- Parser

class Parser {
 public:
  explicit Parser(const std::string& text) : m_tokens(tokenize(text)) {}

  NodePtr parse() {
    NodePtr root = parse_or();
    if (peek().kind != Token::Kind::End) fail(peek(), "an operator or the end of the expression");
    return root;
  }

 private:
  // Bounds the parser's recursion on deeply nested input such as "((((((...".
  class Nesting {
   public:
    Nesting(Parser& p, int offset) : m_p(p) {
      if (++m_p.m_nesting > kMaxDepth) throw ExprError("the expression nests too deeply", offset);
    }
    ~Nesting() { --m_p.m_nesting; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Parser& m_p;
  };

  const Token& peek(size_t ahead = 0) const { return m_tokens[std::min(m_pos + ahead, m_tokens.size() - 1)]; }
  const Token& advance() { return m_tokens[std::min(m_pos++, m_tokens.size() - 1)]; }
  bool at_symbol(const char* sym, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::Symbol && peek(ahead).text == sym;
  }
  bool at_word(const char* word) const { return peek().kind == Token::Kind::Name && peek().text == word; }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Token::Kind::End: return "the end of the expression";
      case Token::Kind::String: return "a string";
      default: return "'" + t.text + "'";
    }
  }

  [[noreturn]] static void fail(const Token& t, const std::string& expected) {
    if (t.kind == Token::Kind::Symbol && t.text == "=")
      throw ExprError("'=' is not a comparison: write '=='", t.offset);
    throw ExprError("expected " + expected + ", got " + describe(t), t.offset);
  }

  static NodePtr make(Node&& n) {
    for (const NodePtr* child : {&n.rtol, &n.atol})
      if (*child) n.depth = std::max(n.depth, (*child)->depth + 1);
    for (const NodePtr& a : n.args) n.depth = std::max(n.depth, a->depth + 1);
    if (n.depth > kMaxDepth) throw ExprError("the expression nests too deeply", n.offset);
    return std::make_shared<const Node>(std::move(n));
  }

  static NodePtr make_op(Node::Kind kind, int offset, std::vector<NodePtr> args, Op op = Op::Add) {
    Node n;
    n.kind = kind;
    n.op = op;
    n.offset = offset;
    n.args = std::move(args);
    return make(std::move(n));
  }

  NodePtr parse_or() {
    Nesting nesting(*this, peek().offset);
    NodePtr left = parse_and();
    while (at_word("or")) {
      const int offset = advance().offset;
      left = make_op(Node::Kind::Binary, offset, {left, parse_and()}, Op::Or);
    }
    return left;
  }

  NodePtr parse_and() {
    NodePtr left = parse_not();
    while (at_word("and")) {
      const int offset = advance().offset;
      left = make_op(Node::Kind::Binary, offset, {left, parse_not()}, Op::And);
    }
    return left;
  }

  NodePtr parse_not() {
    if (!at_word("not")) return parse_cmp();
    Nesting nesting(*this, peek().offset);
    const int offset = advance().offset;
    return make_op(Node::Kind::Not, offset, {parse_not()});
  }

  bool comparison_op(Op& op) const {
    if (peek().kind != Token::Kind::Symbol) return false;
    static const std::pair<const char*, Op> kOps[] = {{"<", Op::Lt},  {"<=", Op::Le}, {">", Op::Gt},
                                                      {">=", Op::Ge}, {"==", Op::Eq}, {"!=", Op::Ne}};
    for (const auto& [text, o] : kOps)
      if (peek().text == text) return op = o, true;
    return false;
  }

  NodePtr parse_cmp() {
    NodePtr left = parse_sum();
    Op op;
    if (!comparison_op(op)) return left;
    const int offset = advance().offset;
    NodePtr right = parse_sum();
    // Python would read a < b < c as a chain and C as (a < b) < c; refuse both readings.
    if (comparison_op(op)) throw ExprError("comparisons do not chain: write a < b and b < c", peek().offset);
    return make_op(Node::Kind::Binary, offset, {left, right}, op);
  }

  NodePtr parse_sum() {
    NodePtr left = parse_prod();
    while (at_symbol("+") || at_symbol("-")) {
      const Token& t = advance();
      left = make_op(Node::Kind::Binary, t.offset, {left, parse_prod()}, t.text == "+" ? Op::Add : Op::Sub);
    }
    return left;
  }

  NodePtr parse_prod() {
    NodePtr left = parse_unary();
    while (at_symbol("*") || at_symbol("/")) {
      const Token& t = advance();
      left = make_op(Node::Kind::Binary, t.offset, {left, parse_unary()}, t.text == "*" ? Op::Mul : Op::Div);
    }
    return left;
  }

  NodePtr parse_unary() {
    if (!at_symbol("-")) return parse_atom();
    Nesting nesting(*this, peek().offset);
    const int offset = advance().offset;
    return make_op(Node::Kind::Negate, offset, {parse_unary()});
  }

  NodePtr parse_atom() {
    const Token& t = peek();
    Node n;
    n.offset = t.offset;
    if (t.kind == Token::Kind::Number || t.kind == Token::Kind::String) {
      n.literal = t.kind == Token::Kind::Number ? Value::num(t.number) : Value::str(t.text);
      advance();
      return make(std::move(n));
    }
    if (t.kind == Token::Kind::Name) {
      if (t.text == "true" || t.text == "false") {
        n.literal = Value::boolean_(t.text == "true");
        advance();
        return make(std::move(n));
      }
      if (t.text == "and" || t.text == "or" || t.text == "not") fail(t, "a value");
      if (at_symbol("(", 1)) return parse_call();
      n.kind = Node::Kind::Name;
      n.name = t.text;
      advance();
      return make(std::move(n));
    }
    if (at_symbol("(")) {
      const int open = advance().offset;
      NodePtr inner = parse_or();
      if (!at_symbol(")")) fail(peek(), "')' to close '(' at " + std::to_string(open));
      advance();
      return inner;
    }
    fail(t, "a value");
  }

  NodePtr parse_call() {
    const Token& name = advance();
    const Function* f = find_function(name.text);
    if (!f) throw ExprError(unknown_function_message(name.text), name.offset);
    const int open = advance().offset;
    Node n;
    n.kind = Node::Kind::Call;
    n.fn = f->fn;
    n.offset = name.offset;
    if (!at_symbol(")")) {
      // Every ',' is followed by an argument: no trailing comma.
      for (;;) {
        parse_argument(*f, n);
        if (at_symbol(")")) break;
        if (!at_symbol(",")) fail(peek(), "',' or ')' to close '(' at " + std::to_string(open));
        advance();
      }
    }
    advance();
    const int count = static_cast<int>(n.args.size());
    if (count < f->min_args || count > f->max_args)
      throw ExprError(std::string(f->name) + "() takes " + f->takes + " (got " + std::to_string(count) + ")",
                      name.offset);
    return make(std::move(n));
  }

  void parse_argument(const Function& f, Node& call) {
    const Token& arg = peek();
    if (arg.kind != Token::Kind::Name || !at_symbol("=", 1)) {
      if (call.rtol || call.atol) throw ExprError("keyword arguments come after positional ones", arg.offset);
      call.args.push_back(parse_or());
      return;
    }
    if (f.fn != Fn::Approx)
      throw ExprError(std::string(f.name) + "() takes no keyword arguments ('=' is not a comparison: write '==')",
                      arg.offset);
    if (arg.text != "rtol" && arg.text != "atol")
      throw ExprError("unknown keyword '" + arg.text + "' for approx(): it takes rtol, atol", arg.offset);
    NodePtr& slot = arg.text == "rtol" ? call.rtol : call.atol;
    if (slot) throw ExprError("keyword '" + arg.text + "' is given twice", arg.offset);
    advance();  // the keyword
    advance();  // '='
    slot = parse_or();
  }

  std::vector<Token> m_tokens;
  size_t m_pos = 0;
  int m_nesting = 0;
};

// ---- Evaluation

// "a number (0.5)": the value helps when it is short; a tensor's length says enough.
std::string describe(const Value& v) {
  if (v.is_number() || v.is_bool()) return "a " + v.type_name() + " (" + v.to_string() + ")";
  if (v.is_string()) return "a string (\"" + (v.text.size() > 40 ? v.text.substr(0, 40) + "..." : v.text) + "\")";
  return "a " + v.type_name();
}

// A number or tensor as a list of elements, without copying; a number is one element that
// broadcasts against a tensor.
struct Elems {
  const double* data = nullptr;
  size_t size = 0;
  bool scalar = false;
  double operator[](size_t i) const { return scalar ? data[0] : data[i]; }
};

Elems numeric(const Value& v, const std::string& who, const std::string& where, int offset) {
  if (v.is_number()) return {&v.number, 1, true};
  if (v.is_tensor()) return {v.tensor.data(), v.tensor.size(), false};
  throw ExprError(who + " needs numbers or tensors, got a " + v.type_name() + (where.empty() ? "" : " " + where),
                  offset);
}

// The length of an elementwise result: equal lengths, or a number with anything.
size_t broadcast_length(const Elems& a, const Elems& b, const std::string& who, int offset) {
  if (!a.scalar && !b.scalar && a.size != b.size)
    throw ExprError(who + " on tensors of different lengths: " + std::to_string(a.size) + " and " +
                        std::to_string(b.size),
                    offset);
  return a.scalar ? b.size : a.size;
}

// max() that keeps a NaN (std::max would drop or keep it depending on the order).
double max_nan(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b); }
double min_nan(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::nan("") : std::min(a, b); }

// numpy.isclose: equal values (infinities included) are close; NaN never is.
bool close(double a, double b, double rtol, double atol) {
  if (a == b) return true;
  if (!std::isfinite(a) || !std::isfinite(b)) return false;
  return std::fabs(a - b) <= atol + rtol * std::fabs(b);
}

double arithmetic(Op op, double a, double b) {
  switch (op) {
    case Op::Add: return a + b;
    case Op::Sub: return a - b;
    case Op::Mul: return a * b;
    default: return a / b;
  }
}

double unary_function(Fn fn, double x) {
  switch (fn) {
    case Fn::Abs: return std::fabs(x);
    case Fn::Sqrt: return std::sqrt(x);
    case Fn::Log: return std::log(x);
    case Fn::Log2: return std::log2(x);
    case Fn::Exp: return std::exp(x);
    case Fn::Floor: return std::floor(x);
    case Fn::Ceil: return std::ceil(x);
    default: return std::round(x);  // halves away from zero, as C does (not Python's to-even)
  }
}

double reduce(Fn fn, const Elems& e, int offset) {
  if (e.size == 0) throw ExprError(function_name(fn) + " of an empty tensor", offset);
  double lo = e[0], hi = e[0], sum = 0, squares = 0;
  for (size_t i = 0; i < e.size; ++i) {
    lo = min_nan(lo, e[i]);
    hi = max_nan(hi, e[i]);
    sum += e[i];
    squares += e[i] * e[i];
  }
  const double mean = sum / static_cast<double>(e.size);
  switch (fn) {
    case Fn::Min: return lo;
    case Fn::Max: return hi;
    case Fn::Sum: return sum;
    case Fn::Mean: return mean;
    case Fn::Spread: return hi - lo;
    case Fn::Norm: return std::sqrt(squares);
    default: {
      // Two passes: sum of squares minus the squared mean loses everything when the spread is small.
      double deviations = 0;
      for (size_t i = 0; i < e.size; ++i) deviations += (e[i] - mean) * (e[i] - mean);
      return std::sqrt(deviations / static_cast<double>(e.size));
    }
  }
}

Value element(const Value& t, const Value& index, const std::string& who, int offset) {
  const Elems e = numeric(t, who, "", offset);
  if (!index.is_number() || !std::isfinite(index.number) || std::floor(index.number) != index.number)
    throw ExprError(who + " needs an integer index, got " + describe(index), offset);
  const double n = static_cast<double>(e.size);
  if (index.number < -n || index.number >= n)
    throw ExprError(who + ": index " + format_number(index.number) + " is out of range for a tensor of " +
                        count_values(e.size),
                    offset);
  const double i = index.number < 0 ? index.number + n : index.number;
  return Value::num(e[static_cast<size_t>(i)]);
}

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

class Evaluator {
 public:
  explicit Evaluator(const Expr::Lookup& lookup) : m_lookup(lookup) {}

  Value eval(const Node& n) const {
    switch (n.kind) {
      case Node::Kind::Literal: return n.literal;
      case Node::Kind::Name: {
        const Value* v = m_lookup ? m_lookup(n.name) : nullptr;
        if (!v) throw ExprError("unknown quantity '" + n.name + "'", n.offset);
        return *v;
      }
      case Node::Kind::Negate: {
        Value v = eval(*n.args[0]);
        numeric(v, "'-'", "", n.offset);
        if (v.is_number()) v.number = -v.number;
        for (double& x : v.tensor) x = -x;
        return v;
      }
      case Node::Kind::Not: return Value::boolean_(!boolean(*n.args[0], "'not' needs a boolean", ""));
      case Node::Kind::Binary: return binary(n);
      case Node::Kind::Call: return call(n);
    }
    return Value();
  }

 private:
  bool boolean(const Node& n, const std::string& need, const std::string& where) const {
    const Value v = eval(n);
    if (!v.is_bool()) throw ExprError(need + ", got " + describe(v) + where, n.offset);
    return v.boolean;
  }

  Value binary(const Node& n) const {
    if (n.op == Op::And || n.op == Op::Or) {
      // Short-circuit, so that `has_x and x > 1` never looks up a missing x.
      const std::string need = std::string("'") + op_text(n.op) + "' needs booleans";
      const bool left = boolean(*n.args[0], need, " on the left");
      if (left == (n.op == Op::Or)) return Value::boolean_(left);
      return Value::boolean_(boolean(*n.args[1], need, " on the right"));
    }
    const Value a = eval(*n.args[0]);
    const Value b = eval(*n.args[1]);
    const std::string who = std::string("'") + op_text(n.op) + "'";
    if (n.op == Op::Add || n.op == Op::Sub || n.op == Op::Mul || n.op == Op::Div) {
      const Elems x = numeric(a, who, "on the left", n.offset), y = numeric(b, who, "on the right", n.offset);
      if (x.scalar && y.scalar) return Value::num(arithmetic(n.op, a.number, b.number));
      std::vector<double> out(broadcast_length(x, y, who, n.offset));
      for (size_t i = 0; i < out.size(); ++i) out[i] = arithmetic(n.op, x[i], y[i]);
      return Value::tens(std::move(out));
    }
    return Value::boolean_(compare(n, a, b, who));
  }

  static bool compare(const Node& n, const Value& a, const Value& b, const std::string& who) {
    const bool equality = n.op == Op::Eq || n.op == Op::Ne;
    if (a.is_number() && b.is_number()) {
      const double x = a.number, y = b.number;
      if (std::isnan(x) || std::isnan(y)) return false;  // even for != (expr.h)
      switch (n.op) {
        case Op::Lt: return x < y;
        case Op::Le: return x <= y;
        case Op::Gt: return x > y;
        case Op::Ge: return x >= y;
        case Op::Eq: return x == y;
        default: return x != y;
      }
    }
    if (a.kind == b.kind && (a.is_string() || a.is_bool())) {
      if (!equality)
        throw ExprError(who + " compares numbers; " + a.type_name() + "s take only == and !=", n.offset);
      const bool same = a.is_string() ? a.text == b.text : a.boolean == b.boolean;
      return n.op == Op::Eq ? same : !same;
    }
    std::string got;
    if (a.is_number()) got = "a " + b.type_name() + " on the right";
    else if (b.is_number()) got = "a " + a.type_name() + " on the left";
    else got = "a " + a.type_name() + " on the left and a " + b.type_name() + " on the right";
    std::string msg = who + " needs two numbers" + (equality ? " (or two strings, or two booleans)" : "");
    msg += ", got " + got;
    if (a.is_tensor() || b.is_tensor()) msg += ": compare max(...) or min(...), or use approx()";
    throw ExprError(msg, n.offset);
  }

  double keyword(const NodePtr& node, double fallback, const char* name) const {
    if (!node) return fallback;
    const Value v = eval(*node);
    if (!v.is_number())
      throw ExprError(std::string("approx(): ") + name + " must be a number, got " + describe(v), node->offset);
    return v.number;
  }

  Value call(const Node& n) const {
    const std::string who = function_name(n.fn);
    if (n.fn == Fn::If) {
      // Only the chosen branch runs, so it may use a quantity that only exists in that case.
      const bool cond = boolean(*n.args[0], "if() needs a boolean condition", "");
      return eval(*n.args[cond ? 1 : 2]);
    }
    std::vector<Value> v;
    v.reserve(n.args.size());
    for (const NodePtr& a : n.args) v.push_back(eval(*a));
    auto arg = [&](size_t i) { return numeric(v[i], who, "as argument " + std::to_string(i + 1), n.offset); };

    switch (n.fn) {
      case Fn::Approx: {
        const Elems a = arg(0), b = arg(1);
        const double rtol = keyword(n.rtol, 1e-5, "rtol"), atol = keyword(n.atol, 1e-8, "atol");
        const size_t len = broadcast_length(a, b, who, n.offset);
        for (size_t i = 0; i < len; ++i)
          if (!close(a[i], b[i], rtol, atol)) return Value::boolean_(false);
        return Value::boolean_(true);
      }
      case Fn::MaxAbsDiff:
      case Fn::RelDiff: {
        const Elems a = arg(0), b = arg(1);
        const size_t len = broadcast_length(a, b, who, n.offset);
        if (len == 0) throw ExprError(who + " of an empty tensor", n.offset);
        double diff = 0, scale = 0;
        for (size_t i = 0; i < len; ++i) {
          diff = max_nan(diff, std::fabs(a[i] - b[i]));
          scale = max_nan(scale, std::fabs(b[i]));
        }
        if (n.fn == Fn::MaxAbsDiff) return Value::num(diff);
        return Value::num(diff == 0 && scale == 0 ? 0.0 : diff / scale);
      }
      case Fn::BitwiseEqual: {
        // No broadcasting: a number equals only a one-element tensor with the same bits.
        const Elems a = arg(0), b = arg(1);
        if (a.size != b.size) return Value::boolean_(false);
        for (size_t i = 0; i < a.size; ++i)
          if (bits(a[i]) != bits(b[i])) return Value::boolean_(false);
        return Value::boolean_(true);
      }
      case Fn::Abs:
      case Fn::Sqrt:
      case Fn::Log:
      case Fn::Log2:
      case Fn::Exp:
      case Fn::Floor:
      case Fn::Ceil:
      case Fn::Round: {
        arg(0);  // a number or tensor
        Value r = std::move(v[0]);
        if (r.is_number()) r.number = unary_function(n.fn, r.number);
        for (double& x : r.tensor) x = unary_function(n.fn, x);
        return r;
      }
      case Fn::Min:
      case Fn::Max:
        if (v.size() > 1) {
          const bool is_min = n.fn == Fn::Min;
          double r = is_min ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
          for (size_t i = 0; i < v.size(); ++i) {
            if (!v[i].is_number())
              throw ExprError(who + " of several values takes numbers, got a " + v[i].type_name() + " as argument " +
                                  std::to_string(i + 1) + ": use " + (is_min ? "min(t)" : "max(t)") + " for a tensor",
                              n.offset);
            r = is_min ? min_nan(r, v[i].number) : max_nan(r, v[i].number);
          }
          return Value::num(r);
        }
        return Value::num(reduce(n.fn, arg(0), n.offset));
      case Fn::Mean:
      case Fn::Sum:
      case Fn::Std:
      case Fn::Spread:
      case Fn::Norm: return Value::num(reduce(n.fn, arg(0), n.offset));
      case Fn::Len: return Value::num(static_cast<double>(arg(0).size));
      case Fn::Diff: {
        // consecutive differences: what each step added to a running total (bytes_sent, t)
        const Elems a = arg(0);
        if (a.size < 2) throw ExprError(who + " needs at least two values, got " + std::to_string(a.size), n.offset);
        std::vector<double> d(a.size - 1);
        for (size_t i = 0; i + 1 < a.size; ++i) d[i] = a[i + 1] - a[i];
        return Value::tens(std::move(d));
      }
      case Fn::At: return element(v[0], v[1], who, n.offset);
      case Fn::First:
      case Fn::Last:
        if (arg(0).size == 0) throw ExprError(who + " of an empty tensor", n.offset);
        return element(v[0], Value::num(n.fn == Fn::First ? 0 : -1), who, n.offset);
      case Fn::Contains:
        for (size_t i = 0; i < 2; ++i)
          if (!v[i].is_string())
            throw ExprError("contains() needs two strings, got " + describe(v[i]) + " as argument " +
                                std::to_string(i + 1),
                            n.offset);
        return Value::boolean_(v[0].text.find(v[1].text) != std::string::npos);
      case Fn::If: break;
    }
    return Value();
  }

  const Expr::Lookup& m_lookup;
};

void collect_names(const Node& n, std::vector<std::pair<std::string, int>>& out) {
  if (n.kind == Node::Kind::Name) out.emplace_back(n.name, n.offset);
  for (const NodePtr& a : n.args) collect_names(*a, out);
  if (n.rtol) collect_names(*n.rtol, out);
  if (n.atol) collect_names(*n.atol, out);
}

}  // namespace

Expr Expr::parse(const std::string& text) {
  Expr e;
  e.m_text = text;
  e.m_root = Parser(text).parse();
  return e;
}

std::vector<std::pair<std::string, int>> Expr::names() const {
  std::vector<std::pair<std::string, int>> all, unique;
  if (m_root) collect_names(*m_root, all);
  // The tree keeps approx()'s keywords apart from its arguments; the text's order is the offsets'.
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  for (const auto& entry : all)
    if (std::none_of(unique.begin(), unique.end(), [&](const auto& u) { return u.first == entry.first; }))
      unique.push_back(entry);
  return unique;
}

Value Expr::eval(const Lookup& lookup) const {
  if (!m_root) throw ExprError("empty expression");
  return Evaluator(lookup).eval(*m_root);
}

bool Expr::eval_bool(const Lookup& lookup) const {
  const Value v = eval(lookup);
  if (!v.is_bool()) throw ExprError("a check must give true or false, got " + describe(v));
  return v.boolean;
}

double Expr::eval_number(const Lookup& lookup) const {
  const Value v = eval(lookup);
  if (!v.is_number())
    throw ExprError("a numeric answer must give a number, got " + describe(v) +
                    (v.is_tensor() ? ": reduce it, e.g. with mean(), max() or last()" : ""));
  return v.number;
}

}  // namespace lessons
