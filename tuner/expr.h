// A small, safe expression language for sweep constraints ("tp_size * dp_size <= 8", "num_experts % ep_size == 0",
// "server != 'trtllm' or not enable_dp_attention"): numbers, strings, booleans, null, + - * / %, comparisons,
// and/or/not (also && || !), parentheses, min/max/abs. No side effects, no loops; evaluation is bounded by the text.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

namespace servetune::tuner {

using ExprValue = std::variant<std::nullptr_t, bool, double, std::string>;

// The value of a JSON scalar (arrays and objects: nullopt).
std::optional<ExprValue> expr_value_of(const nlohmann::ordered_json& j);
std::string expr_value_text(const ExprValue& v);

class Expr {
 public:
  // Throws Error(kUsage) "expression '<text>': <problem> at column N" on a syntax error.
  static Expr parse(const std::string& text);

  const std::string& text() const { return text_; }
  // Every identifier the expression reads (not function names).
  const std::set<std::string>& names() const { return names_; }

  // Looks each name up with `lookup` (nullopt: unknown name). Throws Error(kUsage) naming the expression for an
  // unknown name, a type error (arithmetic on a string, ordering across types), or division by zero.
  ExprValue evaluate(const std::function<std::optional<ExprValue>(const std::string&)>& lookup) const;
  // evaluate() that must produce a boolean.
  bool test(const std::function<std::optional<ExprValue>(const std::string&)>& lookup) const;

  struct Node;

 private:
  std::string text_;
  std::set<std::string> names_;
  std::shared_ptr<const Node> root_;
};

}  // namespace servetune::tuner
