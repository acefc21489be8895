// Constraint expressions: arithmetic and logic, the names they read, and one clear error for every bad input.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "tuner/expr.h"

namespace servetune::tuner {
namespace {

ExprValue eval(const std::string& text, const std::map<std::string, ExprValue>& vars = {}) {
  return Expr::parse(text).evaluate([&](const std::string& n) -> std::optional<ExprValue> {
    const auto it = vars.find(n);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

std::string expr_error_of(const std::string& text, const std::map<std::string, ExprValue>& vars = {}) {
  try {
    eval(text, vars);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    return e.what();
  }
  return "";
}

TEST(TunerExpr, ArithmeticAndPrecedence) {
  EXPECT_EQ(std::get<double>(eval("1 + 2 * 3")), 7.0);
  EXPECT_EQ(std::get<double>(eval("(1 + 2) * 3")), 9.0);
  EXPECT_EQ(std::get<double>(eval("-2 * -3")), 6.0);
  EXPECT_EQ(std::get<double>(eval("7 % 4 + 10 / 4")), 5.5);
  EXPECT_EQ(std::get<double>(eval("min(4, 2, 8) + max(1, 3) + abs(-2)")), 7.0);
  EXPECT_EQ(std::get<std::string>(eval("'ab' + \"cd\"")), "abcd");
}

TEST(TunerExpr, ComparisonsAndLogic) {
  const std::map<std::string, ExprValue> v = {{"tp_size", 4.0}, {"dp_size", 2.0}, {"server", std::string("vllm")},
                                               {"enable_dp_attention", true}, {"context_length", nullptr}};
  EXPECT_TRUE(std::get<bool>(eval("tp_size * dp_size <= 8", v)));
  EXPECT_FALSE(std::get<bool>(eval("tp_size * dp_size < 8", v)));
  EXPECT_TRUE(std::get<bool>(eval("server == 'vllm' and enable_dp_attention", v)));
  EXPECT_TRUE(std::get<bool>(eval("server != 'sglang' || !enable_dp_attention", v)));
  EXPECT_TRUE(std::get<bool>(eval("not (tp_size > 4) && context_length == null", v)));
  EXPECT_FALSE(std::get<bool>(eval("tp_size == '4'", v)));  // equality across types is false, not an error
  EXPECT_TRUE(std::get<bool>(eval("'a' < 'b'")));
}

TEST(TunerExpr, NamesAreCollected) {
  const Expr e = Expr::parse("num_experts % ep_size == 0 and max(tp_size, 1) <= devices");
  EXPECT_EQ(e.names(), (std::set<std::string>{"num_experts", "ep_size", "tp_size", "devices"}));
}

TEST(TunerExpr, ErrorsNameTheExpressionAndTheProblem) {
  EXPECT_NE(expr_error_of("tp_size <= 8").find("unknown name 'tp_size'"), std::string::npos);
  EXPECT_NE(expr_error_of("1 +").find("unexpected end"), std::string::npos);
  EXPECT_NE(expr_error_of("(1 + 2").find("expected ')'"), std::string::npos);
  EXPECT_NE(expr_error_of("1 < 2 < 3").find("do not chain"), std::string::npos);
  EXPECT_NE(expr_error_of("1 / 0").find("division by zero"), std::string::npos);
  EXPECT_NE(expr_error_of("'a' * 2").find("needs numbers"), std::string::npos);
  EXPECT_NE(expr_error_of("1 < 'a'").find("cannot order"), std::string::npos);
  EXPECT_NE(expr_error_of("x = 1", {{"x", 1.0}}).find("unexpected character '='"), std::string::npos);
  EXPECT_NE(expr_error_of("system('rm')").find("unknown function 'system'"), std::string::npos);
  EXPECT_NE(expr_error_of("'open").find("unterminated string"), std::string::npos);
  EXPECT_NE(expr_error_of("1 +").find("expression '1 +'"), std::string::npos);
}

TEST(TunerExpr, TestRequiresABoolean) {
  const Expr e = Expr::parse("tp_size * 2");
  try {
    e.test([](const std::string&) { return ExprValue(2.0); });
    FAIL() << "a number is not a constraint";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("must be true or false"), std::string::npos);
  }
}

}  // namespace
}  // namespace servetune::tuner
