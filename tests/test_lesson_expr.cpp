// The lesson expression language (lessons/runner/expr.h): precedence, literals, every function and
// its edge cases, the type rules of comparisons, short-circuiting, and the text and offset of the
// errors a lesson author sees.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "expr.h"

namespace {

using lessons::Expr;
using lessons::ExprError;
using lessons::Value;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// The quantities a run might have measured.
const std::map<std::string, Value>& quantities() {
  static const std::map<std::string, Value> q = {
      {"x", Value::num(2)},
      {"y", Value::num(3)},
      {"half", Value::num(0.5)},
      {"zero", Value::num(0.0)},
      {"neg_zero", Value::num(-0.0)},
      {"nan", Value::num(kNaN)},
      {"inf", Value::num(kInf)},
      {"max", Value::num(7)},  // a quantity may share a function's name
      {"variation.ratio", Value::num(1.5)},
      {"t", Value::tens({1, 2, 3})},
      {"u", Value::tens({10, 20, 30})},
      {"w", Value::tens({1, 2})},
      {"one", Value::tens({5})},
      {"empty", Value::tens({})},
      {"with_nan", Value::tens({1, kNaN, 3})},
      {"s", Value::str("hello world")},
      {"yes", Value::boolean_(true)},
      {"no", Value::boolean_(false)},
  };
  return q;
}

const Value* lookup(const std::string& name) {
  const auto it = quantities().find(name);
  return it == quantities().end() ? nullptr : &it->second;
}

Value eval(const std::string& text) { return Expr::parse(text).eval(lookup); }
bool check(const std::string& text) { return Expr::parse(text).eval_bool(lookup); }
double number(const std::string& text) { return Expr::parse(text).eval_number(lookup); }
std::vector<double> tensor(const std::string& text) {
  const Value v = eval(text);
  EXPECT_TRUE(v.is_tensor()) << text << " gave " << v.type_name();
  return v.tensor;
}

// The error that parsing `text` throws; fails the test when it parses.
ExprError parse_error(const std::string& text) {
  try {
    Expr::parse(text);
  } catch (const ExprError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a parse error for: " << text;
  return ExprError("(none)");
}

// The error that evaluating `text` throws (it must parse); fails the test when it does not throw.
ExprError eval_error(const std::string& text) {
  const Expr e = Expr::parse(text);
  try {
    e.eval(lookup);
  } catch (const ExprError& err) {
    return err;
  }
  ADD_FAILURE() << "expected an evaluation error for: " << text;
  return ExprError("(none)");
}

#define EXPECT_MESSAGE(error, substring) \
  EXPECT_NE(std::string((error).what()).find(substring), std::string::npos) << (error).what()

TEST(LessonExpr, ArithmeticPrecedenceAndAssociativity) {
  EXPECT_EQ(number("1 - 2 - 3"), -4);
  EXPECT_EQ(number("2 + 3 * 4"), 14);
  EXPECT_EQ(number("(2 + 3) * 4"), 20);
  EXPECT_EQ(number("8 / 4 / 2"), 1);
  EXPECT_EQ(number("2 * 3 - 4 / 2"), 4);
  EXPECT_EQ(number("-2 * 3"), -6);
  EXPECT_EQ(number("2 * -3"), -6);
  EXPECT_EQ(number("- -2"), 2);
  EXPECT_EQ(number("1 - -1"), 2);
  EXPECT_EQ(number("-x + y"), 1);
}

TEST(LessonExpr, LogicPrecedence) {
  EXPECT_FALSE(check("not no and no"));  // (not no) and no
  EXPECT_TRUE(check("not (no and no)"));
  EXPECT_TRUE(check("yes or no and no"));  // yes or (no and no)
  EXPECT_FALSE(check("(yes or no) and no"));
  EXPECT_TRUE(check("not x > 3"));  // not (x > 3)
  EXPECT_TRUE(check("not not yes"));
  EXPECT_TRUE(check("1 + 2 == 3 and 2 * 2 == 4"));
  EXPECT_TRUE(check("x < y or nan > 0"));
}

TEST(LessonExpr, NumberLiterals) {
  EXPECT_EQ(number("12"), 12);
  EXPECT_EQ(number("1.5"), 1.5);
  EXPECT_EQ(number(".5"), 0.5);
  EXPECT_EQ(number("1e-5"), 1e-5);
  EXPECT_EQ(number("2.5E+3"), 2500);
  EXPECT_EQ(number("3e2"), 300);
  EXPECT_EQ(number("0.1 + 0.2"), 0.1 + 0.2);
}

TEST(LessonExpr, StringLiteralsAndEscapes) {
  EXPECT_EQ(eval("'plain'").text, "plain");
  EXPECT_EQ(eval("\"double\"").text, "double");
  EXPECT_EQ(eval("'it\\'s'").text, "it's");
  EXPECT_EQ(eval("\"say \\\"hi\\\"\"").text, "say \"hi\"");
  EXPECT_EQ(eval("'say \"hi\"'").text, "say \"hi\"");
  EXPECT_EQ(eval("'a\\\\b'").text, "a\\b");
  EXPECT_EQ(eval("'two\\nlines'").text, "two\nlines");
  EXPECT_EQ(eval("''").text, "");
}

TEST(LessonExpr, BooleansNamesAndDots) {
  EXPECT_TRUE(check("true"));
  EXPECT_FALSE(check("false"));
  EXPECT_EQ(number("variation.ratio * 2"), 3);
  // Without parentheses a function's name is just a quantity.
  EXPECT_EQ(number("max + 1"), 8);
  EXPECT_EQ(number("max(max, 1)"), 7);
}

TEST(LessonExpr, TensorArithmetic) {
  EXPECT_EQ(tensor("t + u"), (std::vector<double>{11, 22, 33}));
  EXPECT_EQ(tensor("u / t"), (std::vector<double>{10, 10, 10}));
  EXPECT_EQ(tensor("t * 2"), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(tensor("2 - t"), (std::vector<double>{1, 0, -1}));
  EXPECT_EQ(tensor("-t"), (std::vector<double>{-1, -2, -3}));
  EXPECT_EQ(tensor("t / 0"), (std::vector<double>{kInf, kInf, kInf}));
  EXPECT_EQ(tensor("empty + 1"), std::vector<double>{});

  const ExprError lengths = eval_error("t + w");
  EXPECT_MESSAGE(lengths, "'+' on tensors of different lengths: 3 and 2");
  EXPECT_EQ(lengths.offset(), 2);
  EXPECT_MESSAGE(eval_error("w * t"), "lengths: 2 and 3");
  EXPECT_MESSAGE(eval_error("s + 1"), "'+' needs numbers or tensors, got a string on the left");
  EXPECT_MESSAGE(eval_error("1 - yes"), "'-' needs numbers or tensors, got a boolean on the right");
  EXPECT_MESSAGE(eval_error("-s"), "'-' needs numbers or tensors, got a string");
}

TEST(LessonExpr, IeeeDivisionAndNaNComparisons) {
  EXPECT_EQ(number("1 / 0"), kInf);
  EXPECT_TRUE(std::isnan(number("0 / 0")));
  // Every comparison with NaN is false, != included.
  EXPECT_FALSE(check("nan < 1"));
  EXPECT_FALSE(check("nan >= nan"));
  EXPECT_FALSE(check("nan == nan"));
  EXPECT_FALSE(check("0 / 0 != 0 / 0"));
  EXPECT_FALSE(check("nan != 1"));
  EXPECT_TRUE(check("inf > 1e308"));
}

TEST(LessonExpr, ComparisonsOfStringsAndBooleans) {
  EXPECT_TRUE(check("s == 'hello world'"));
  EXPECT_TRUE(check("s != \"x\""));
  EXPECT_TRUE(check("yes == true"));
  EXPECT_TRUE(check("true != false"));
  EXPECT_TRUE(check("0 == -0"));
  EXPECT_MESSAGE(eval_error("s < 'x'"), "'<' compares numbers; strings take only == and !=");
  EXPECT_MESSAGE(eval_error("true < false"), "booleans take only == and !=");
}

TEST(LessonExpr, ComparisonTypeErrorsSuggestReductions) {
  const ExprError left = eval_error("x + t > 1");
  EXPECT_MESSAGE(left, "'>' needs two numbers, got a tensor of 3 values on the left");
  EXPECT_MESSAGE(left, "max(...)");
  EXPECT_MESSAGE(left, "approx()");
  EXPECT_EQ(left.offset(), 6);
  EXPECT_MESSAGE(eval_error("1 <= t"), "'<=' needs two numbers, got a tensor of 3 values on the right");
  const ExprError both = eval_error("t == u");
  EXPECT_MESSAGE(both, "'==' needs two numbers (or two strings, or two booleans)");
  EXPECT_MESSAGE(both, "a tensor of 3 values on the left and a tensor of 3 values on the right");
  EXPECT_MESSAGE(eval_error("s == 1"), "got a string on the left");
  const ExprError mixed = eval_error("yes == 'true'");
  EXPECT_MESSAGE(mixed, "a boolean on the left and a string on the right");
  EXPECT_EQ(std::string(mixed.what()).find("approx"), std::string::npos);
}

TEST(LessonExpr, AndOrNotNeedBooleansAndShortCircuit) {
  EXPECT_FALSE(check("false and unknown_name"));
  EXPECT_TRUE(check("true or unknown_name"));
  EXPECT_FALSE(check("no and 1 / unknown > 0"));
  const ExprError unknown = eval_error("true and nope");
  EXPECT_MESSAGE(unknown, "unknown quantity 'nope'");
  EXPECT_EQ(unknown.offset(), 9);
  EXPECT_MESSAGE(eval_error("1 and true"), "'and' needs booleans, got a number (1) on the left");
  EXPECT_MESSAGE(eval_error("false or half"), "'or' needs booleans, got a number (0.5) on the right");
  EXPECT_MESSAGE(eval_error("not t"), "'not' needs a boolean, got a tensor of 3 values");
}

TEST(LessonExpr, IfEvaluatesOnlyTheChosenBranch) {
  EXPECT_EQ(number("if(true, 1, unknown)"), 1);
  EXPECT_EQ(number("if(false, unknown, 2)"), 2);
  EXPECT_EQ(eval("if(x > y, 'big', 'small')").text, "small");
  EXPECT_MESSAGE(eval_error("if(1, 2, 3)"), "if() needs a boolean condition, got a number (1)");
}

TEST(LessonExpr, ApproxIsNumpyAllclose) {
  EXPECT_TRUE(check("approx(1.0, 1.0 + 1e-9)"));
  EXPECT_FALSE(check("approx(1, 1.001)"));
  EXPECT_TRUE(check("approx(1, 1.001, rtol=1e-2)"));
  EXPECT_TRUE(check("approx(0, 1e-9)"));  // within the default atol
  EXPECT_FALSE(check("approx(0, 1e-6)"));
  EXPECT_TRUE(check("approx(0, 1e-6, atol=1e-5)"));
  EXPECT_FALSE(check("approx(0, 1e-6, atol=1e-5 / 100, rtol=0)"));
  EXPECT_TRUE(check("approx(0, 1e-6, atol=2e-6, rtol=0)"));
  // Relative to |b|, as numpy: not symmetric.
  EXPECT_TRUE(check("approx(1, 2, rtol=0.5, atol=0)"));
  EXPECT_FALSE(check("approx(2, 1, rtol=0.5, atol=0)"));
  // Tensors, elementwise, and numbers broadcast.
  EXPECT_TRUE(check("approx(t, t + 1e-9)"));
  EXPECT_FALSE(check("approx(t, u)"));
  EXPECT_TRUE(check("approx(u, t * 10)"));
  EXPECT_FALSE(check("approx(t, 2)"));
  EXPECT_TRUE(check("approx(t * 0 + 2, 2)"));
  EXPECT_TRUE(check("approx(2, t * 0 + 2)"));
  EXPECT_TRUE(check("approx(empty, empty)"));
  // NaN is never close; equal infinities are.
  EXPECT_FALSE(check("approx(nan, nan)"));
  EXPECT_FALSE(check("approx(with_nan, with_nan)"));
  EXPECT_TRUE(check("approx(inf, inf)"));
  EXPECT_FALSE(check("approx(inf, 1e308)"));
  EXPECT_FALSE(check("approx(inf, -inf)"));

  EXPECT_MESSAGE(eval_error("approx(t, w)"), "approx() on tensors of different lengths: 3 and 2");
  EXPECT_MESSAGE(eval_error("approx(s, 1)"), "approx() needs numbers or tensors, got a string as argument 1");
  EXPECT_MESSAGE(eval_error("approx(1, 1, rtol=t)"), "approx(): rtol must be a number, got a tensor of 3 values");
}

TEST(LessonExpr, MaxAbsDiffAndRelDiff) {
  EXPECT_EQ(number("max_abs_diff(t, u)"), 27);
  EXPECT_EQ(number("max_abs_diff(t, 2)"), 1);
  EXPECT_EQ(number("max_abs_diff(x, y)"), 1);
  EXPECT_EQ(number("max_abs_diff(u, t * 10)"), 0);
  EXPECT_TRUE(std::isnan(number("max_abs_diff(with_nan, t)")));
  EXPECT_FALSE(check("max_abs_diff(with_nan, t) < 1"));
  EXPECT_MESSAGE(eval_error("max_abs_diff(t, w)"), "max_abs_diff() on tensors of different lengths: 3 and 2");
  EXPECT_MESSAGE(eval_error("max_abs_diff(empty, empty)"), "max_abs_diff() of an empty tensor");

  EXPECT_DOUBLE_EQ(number("rel_diff(t, u)"), 27.0 / 30.0);
  EXPECT_EQ(number("rel_diff(u, u)"), 0);
  EXPECT_EQ(number("rel_diff(0, 0)"), 0);
  EXPECT_EQ(number("rel_diff(t * 0, t * 0)"), 0);
  EXPECT_EQ(number("rel_diff(1, 0)"), kInf);
  EXPECT_EQ(number("rel_diff(t, 4)"), 0.75);
  EXPECT_MESSAGE(eval_error("rel_diff(t, w)"), "lengths: 3 and 2");
}

TEST(LessonExpr, BitwiseEqual) {
  EXPECT_FALSE(check("bitwise_equal(0.1 + 0.2, 0.3)"));
  EXPECT_TRUE(check("approx(0.1 + 0.2, 0.3)"));
  EXPECT_TRUE(check("bitwise_equal(t, t)"));
  EXPECT_TRUE(check("bitwise_equal(t, t + 0)"));
  EXPECT_FALSE(check("bitwise_equal(t, t + 1e-15)"));
  EXPECT_FALSE(check("bitwise_equal(zero, neg_zero)"));
  EXPECT_FALSE(check("bitwise_equal(0, -0)"));
  EXPECT_TRUE(check("bitwise_equal(nan, nan)"));  // the same bits, though nan == nan is false
  EXPECT_TRUE(check("bitwise_equal(x, 2)"));
  EXPECT_FALSE(check("bitwise_equal(t, w)"));
  EXPECT_TRUE(check("bitwise_equal(one, 5)"));
  EXPECT_TRUE(check("bitwise_equal(5, one)"));
  EXPECT_FALSE(check("bitwise_equal(t, 1)"));
  EXPECT_TRUE(check("bitwise_equal(empty, empty)"));
  EXPECT_MESSAGE(eval_error("bitwise_equal(s, s)"), "bitwise_equal() needs numbers or tensors, got a string");
}

TEST(LessonExpr, ElementwiseFunctions) {
  EXPECT_EQ(number("abs(-2)"), 2);
  EXPECT_EQ(tensor("abs(t - 2)"), (std::vector<double>{1, 0, 1}));
  EXPECT_TRUE(check("bitwise_equal(sqrt(t * t), t)"));
  EXPECT_EQ(number("sqrt(16)"), 4);
  EXPECT_TRUE(std::isnan(number("sqrt(-1)")));
  EXPECT_EQ(number("log(exp(1))"), 1);
  EXPECT_EQ(number("log(0)"), -kInf);
  EXPECT_EQ(number("log2(8)"), 3);
  EXPECT_EQ(tensor("log2(u / 10 * 2)")[0], 1);
  EXPECT_EQ(number("exp(0)"), 1);
  EXPECT_EQ(number("floor(-1.5)"), -2);
  EXPECT_EQ(number("ceil(-1.5)"), -1);
  EXPECT_EQ(number("round(2.5)"), 3);
  EXPECT_EQ(number("round(-2.5)"), -3);
  EXPECT_EQ(tensor("floor(t / 2)"), (std::vector<double>{0, 1, 1}));
  EXPECT_MESSAGE(eval_error("abs(s)"), "abs() needs numbers or tensors, got a string");
}

TEST(LessonExpr, Reductions) {
  EXPECT_EQ(number("min(t)"), 1);
  EXPECT_EQ(number("max(t)"), 3);
  EXPECT_EQ(number("mean(t)"), 2);
  EXPECT_EQ(number("sum(t)"), 6);
  EXPECT_DOUBLE_EQ(number("std(t)"), std::sqrt(2.0 / 3.0));  // population, not sample
  EXPECT_EQ(number("spread(t)"), 2);
  EXPECT_DOUBLE_EQ(number("norm(t)"), std::sqrt(14.0));
  // A number is a one-element tensor.
  EXPECT_EQ(number("max(5)"), 5);
  EXPECT_EQ(number("std(5)"), 0);
  EXPECT_EQ(number("spread(x)"), 0);
  EXPECT_EQ(number("norm(-3)"), 3);
  // NaN is not skipped.
  EXPECT_TRUE(std::isnan(number("max(with_nan)")));
  EXPECT_TRUE(std::isnan(number("min(with_nan)")));
  EXPECT_FALSE(check("max(with_nan) > 0"));
  for (const char* f : {"min", "max", "mean", "sum", "std", "spread", "norm"}) {
    const ExprError e = eval_error(std::string("1 + ") + f + "(empty)");
    EXPECT_MESSAGE(e, std::string(f) + "() of an empty tensor");
    EXPECT_EQ(e.offset(), 4);
  }
}

TEST(LessonExpr, MinMaxOfSeveralNumbers) {
  EXPECT_EQ(number("max(1, 5, 3)"), 5);
  EXPECT_EQ(number("min(x, y)"), 2);
  EXPECT_EQ(number("min(4, -1, 2, 8)"), -1);
  EXPECT_TRUE(std::isnan(number("max(nan, 1)")));
  EXPECT_TRUE(std::isnan(number("max(1, nan)")));
  const ExprError e = eval_error("max(t, 1)");
  EXPECT_MESSAGE(e, "max() of several values takes numbers, got a tensor of 3 values as argument 1");
  EXPECT_MESSAGE(e, "use max(t)");
}

TEST(LessonExpr, LenAtFirstLast) {
  EXPECT_EQ(number("len(t)"), 3);
  EXPECT_EQ(number("len(x)"), 1);
  EXPECT_EQ(number("len(empty)"), 0);
  EXPECT_MESSAGE(eval_error("len(s)"), "len() needs numbers or tensors, got a string");

  EXPECT_EQ(number("at(t, 0)"), 1);
  EXPECT_EQ(number("at(t, 2)"), 3);
  EXPECT_EQ(number("at(t, -1)"), 3);
  EXPECT_EQ(number("at(t, -3)"), 1);
  EXPECT_EQ(number("at(t, 1.0)"), 2);
  EXPECT_EQ(number("at(x, 0)"), 2);
  EXPECT_MESSAGE(eval_error("at(t, 3)"), "at(): index 3 is out of range for a tensor of 3 values");
  EXPECT_MESSAGE(eval_error("at(t, -4)"), "index -4 is out of range for a tensor of 3 values");
  EXPECT_MESSAGE(eval_error("at(empty, 0)"), "index 0 is out of range for a tensor of 0 values");
  EXPECT_MESSAGE(eval_error("at(t, 1.5)"), "at() needs an integer index, got a number (1.5)");
  EXPECT_MESSAGE(eval_error("at(t, nan)"), "at() needs an integer index");
  EXPECT_MESSAGE(eval_error("at(t, 's')"), "at() needs an integer index, got a string");

  EXPECT_EQ(number("first(t)"), 1);
  EXPECT_EQ(number("last(t)"), 3);
  EXPECT_EQ(number("last(one)"), 5);
  EXPECT_MESSAGE(eval_error("first(empty)"), "first() of an empty tensor");
  EXPECT_MESSAGE(eval_error("last(empty)"), "last() of an empty tensor");
}

TEST(LessonExpr, Contains) {
  EXPECT_TRUE(check("contains(s, 'world')"));
  EXPECT_FALSE(check("contains(s, 'World')"));
  EXPECT_TRUE(check("contains(s, '')"));
  EXPECT_MESSAGE(eval_error("contains(s, 1)"), "contains() needs two strings, got a number (1) as argument 2");
}

TEST(LessonExpr, UnknownQuantity) {
  const ExprError e = eval_error("x + nope");
  EXPECT_STREQ(e.what(), "unknown quantity 'nope'");
  EXPECT_EQ(e.offset(), 4);
  EXPECT_THROW(Expr::parse("x").eval(nullptr), ExprError);
}

TEST(LessonExpr, ParseErrorsPointAtTheToken) {
  struct Case {
    const char* text;
    int offset;
    const char* message;
  };
  const Case cases[] = {
      {"approx(a b)", 9, "expected ',' or ')' to close '(' at 6, got 'b'"},
      {"1 +", 3, "expected a value, got the end of the expression"},
      {"", 0, "expected a value, got the end of the expression"},
      {"  ", 2, "expected a value, got the end of the expression"},
      {"(1 + 2", 6, "expected ')' to close '(' at 0, got the end of the expression"},
      {"x * (y + 1", 10, "expected ')' to close '(' at 4"},
      {"x y", 2, "expected an operator or the end of the expression, got 'y'"},
      {"x )", 2, "expected an operator or the end of the expression, got ')'"},
      {"and", 0, "expected a value, got 'and'"},
      {"x and or y", 6, "expected a value, got 'or'"},
      {"abs(1,)", 6, "expected a value, got ')'"},
      {"1 < x < 3", 6, "comparisons do not chain: write a < b and b < c"},
      {"1 == x == 1", 7, "comparisons do not chain"},
      {"x = 1", 2, "'=' is not a comparison: write '=='"},
      {"(x = 1)", 3, "'=' is not a comparison: write '=='"},
      {"x && y", 2, "'&&' is not an operator: write 'and'"},
      {"x || y", 2, "'||' is not an operator: write 'or'"},
      {"!x", 0, "'!' is not an operator: write 'not'"},
      {"x ** 2", 2, "'**' is not an operator"},
      {"x # y", 2, "unexpected character '#'"},
      {"x \u2264 1", 2, "unexpected character '\u2264'"},  // a pasted "less than or equal"
      {"s == \u201chi\u201d", 5, "unexpected character '\u201c'"},  // curly quotes from a document
      {"'abc", 0, "unterminated string"},
      {"x == 'ab", 5, "unterminated string"},
      {"'ab\\", 0, "unterminated string"},
      {"'a\\tb'", 2, "unknown escape '\\t' in a string"},
      {"2x", 0, "malformed number '2x'"},
      {"1 + 1e", 4, "malformed number '1e'"},
      {"1.2.3", 0, "malformed number '1.2.3'"},
      {"1e999", 0, "number '1e999' is out of range"},
  };
  for (const Case& c : cases) {
    const ExprError e = parse_error(c.text);
    EXPECT_EQ(e.offset(), c.offset) << c.text << ": " << e.what();
    EXPECT_MESSAGE(e, c.message);
  }
}

TEST(LessonExpr, FunctionNamesAndAritiesAreCheckedAtParseTime) {
  struct Case {
    const char* text;
    int offset;
    const char* message;
  };
  const Case cases[] = {
      {"aprox(1, 2)", 0, "unknown function 'aprox' (did you mean approx?)"},
      {"x > maxx(t)", 4, "unknown function 'maxx' (did you mean max?)"},
      {"frobnicate(1)", 0, "unknown function 'frobnicate': the functions are approx, max_abs_diff"},
      {"variation.max(t)", 0, "unknown function 'variation.max'"},
      {"abs(1, 2)", 0, "abs() takes 1 argument (got 2)"},
      {"approx(1)", 0, "approx() takes 2 arguments and the keywords rtol, atol (got 1)"},
      {"x + approx(1, 2, 3)", 4, "approx() takes 2 arguments and the keywords rtol, atol (got 3)"},
      {"approx(1, rtol=1)", 0, "approx() takes 2 arguments"},
      {"min()", 0, "min() takes 1 argument (a tensor) or 2 or more numbers (got 0)"},
      {"if(true, 1)", 0, "if() takes 3 arguments (got 2)"},
      {"contains('a')", 0, "contains() takes 2 arguments (got 1)"},
      {"approx(1, 2, rtl=1)", 13, "unknown keyword 'rtl' for approx(): it takes rtol, atol"},
      {"approx(1, rtol=1, 2)", 18, "keyword arguments come after positional ones"},
      {"approx(1, 2, rtol=1, rtol=2)", 21, "keyword 'rtol' is given twice"},
      {"max(t, rtol=1)", 7, "max() takes no keyword arguments"},
      {"approx(1, 2, rtol=)", 18, "expected a value, got ')'"},
  };
  for (const Case& c : cases) {
    const ExprError e = parse_error(c.text);
    EXPECT_EQ(e.offset(), c.offset) << c.text << ": " << e.what();
    EXPECT_MESSAGE(e, c.message);
  }
}

TEST(LessonExpr, DeepNestingIsAnErrorNotACrash) {
  EXPECT_MESSAGE(parse_error(std::string(5000, '(') + "1" + std::string(5000, ')')), "nests too deeply");
  EXPECT_MESSAGE(parse_error(std::string(5000, '-') + "1"), "nests too deeply");
  std::string chain = "1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_MESSAGE(parse_error(chain), "nests too deeply");
  std::string ok = "1";
  for (int i = 0; i < 100; ++i) ok += " + 1";
  EXPECT_EQ(number(ok), 101);
}

TEST(LessonExpr, NamesInOrderOfFirstAppearance) {
  const std::string text = "approx(b, a, atol=tol2, rtol=tol) and a > c.d and max(b) > 0 and max > 1";
  const auto names = Expr::parse(text).names();
  const std::vector<std::pair<std::string, int>> want = {
      {"b", 7},
      {"a", 10},
      {"tol2", static_cast<int>(text.find("tol2"))},
      {"tol", static_cast<int>(text.find("tol)"))},
      {"c.d", static_cast<int>(text.find("c.d"))},
      {"max", static_cast<int>(text.find("max >"))},
  };
  EXPECT_EQ(names, want);
  EXPECT_TRUE(Expr::parse("1 + 2 * len('x')").names().empty());
  EXPECT_EQ(Expr::parse("if(ok, x, x)").names(), (std::vector<std::pair<std::string, int>>{{"ok", 3}, {"x", 7}}));
}

TEST(LessonExpr, EvalBoolAndEvalNumberCheckTheKind) {
  EXPECT_TRUE(check("x > 1"));
  EXPECT_EQ(number("x * y"), 6);
  try {
    check("half");
    ADD_FAILURE() << "no error";
  } catch (const ExprError& e) {
    EXPECT_STREQ(e.what(), "a check must give true or false, got a number (0.5)");
  }
  try {
    number("x > 1");
    ADD_FAILURE() << "no error";
  } catch (const ExprError& e) {
    EXPECT_STREQ(e.what(), "a numeric answer must give a number, got a boolean (true)");
  }
  try {
    number("t");
    ADD_FAILURE() << "no error";
  } catch (const ExprError& e) {
    EXPECT_MESSAGE(e, "got a tensor of 3 values: reduce it");
  }
  EXPECT_THROW(check("s"), ExprError);
}

TEST(LessonExpr, ExprIsAValue) {
  Expr empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_TRUE(empty.names().empty());
  EXPECT_THROW(empty.eval(lookup), ExprError);
  const Expr e = Expr::parse("x + 1");
  const Expr copy = e;
  EXPECT_FALSE(copy.empty());
  EXPECT_EQ(copy.text(), "x + 1");
  EXPECT_EQ(copy.eval_number(lookup), 3);
  EXPECT_EQ(e.eval_number(lookup), 3);
}

TEST(LessonExpr, ValueTypeNamesAndStrings) {
  EXPECT_EQ(Value::num(1).type_name(), "number");
  EXPECT_EQ(Value::boolean_(true).type_name(), "boolean");
  EXPECT_EQ(Value::str("a").type_name(), "string");
  EXPECT_EQ(Value::tens({1, 2, 3}).type_name(), "tensor of 3 values");
  EXPECT_EQ(Value::tens({1}).type_name(), "tensor of 1 value");

  EXPECT_EQ(Value::num(0.5).to_string(), "0.5");
  EXPECT_EQ(Value::num(1e-7).to_string(), "1e-07");
  EXPECT_EQ(Value::num(1234567).to_string(), "1234567");  // whole numbers in full: byte counts, steps
  EXPECT_EQ(Value::num(1234567.5).to_string(), "1.23457e+06");
  EXPECT_EQ(Value::num(-3).to_string(), "-3");
  EXPECT_EQ(Value::num(1e20).to_string(), "1e+20");
  EXPECT_EQ(Value::num(kInf).to_string(), "inf");
  EXPECT_EQ(Value::boolean_(true).to_string(), "true");
  EXPECT_EQ(Value::boolean_(false).to_string(), "false");
  EXPECT_EQ(Value::str("as is").to_string(), "as is");
  EXPECT_EQ(Value::tens({}).to_string(), "[] (0 values)");
  EXPECT_EQ(Value::tens({1.5}).to_string(), "[1.5] (1 value)");
  EXPECT_EQ(Value::tens({1, 2, 3}).to_string(), "[1, 2, 3] (3 values)");
  EXPECT_EQ(Value::tens({1, 2, 3, 4, 5, 6}).to_string(), "[1, 2, 3, 4, 5, 6] (6 values)");
  EXPECT_EQ(Value::tens({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}).to_string(), "[0, 1, 2, 3, 4, ... 9] (10 values)");
  EXPECT_EQ(Value::tens({0, 1, 2, 3, 4, 5, 6}).to_string(), "[0, 1, 2, 3, 4, ... 6] (7 values)");
}

TEST(LessonExpr, DiffGivesWhatEachStepAdded) {
  std::map<std::string, Value> q = {{"sent", Value::tens({10, 25, 25, 40})}};
  auto look = [&](const std::string& n) -> const Value* { auto it = q.find(n); return it == q.end() ? nullptr : &it->second; };
  const Value d = Expr::parse("diff(sent)").eval(look);
  ASSERT_TRUE(d.is_tensor());
  EXPECT_EQ(d.tensor, (std::vector<double>{15, 0, 15}));
  q["one"] = Value::num(3);
  EXPECT_THROW(Expr::parse("diff(one)").eval(look), ExprError);
}

}  // namespace
