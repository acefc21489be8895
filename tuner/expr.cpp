// Constraint expressions (see expr.h): a recursive-descent parser into a small tree, evaluated over a lookup.
#include "tuner/expr.h"

#include <cctype>
#include <cmath>
#include <sstream>
#include <vector>

#include "servetune/error.h"

namespace servetune::tuner {

struct Expr::Node {
  enum class Kind { kLiteral, kName, kUnary, kBinary, kCall } kind = Kind::kLiteral;
  ExprValue value;
  std::string op;  // operator, name or function
  std::vector<std::shared_ptr<const Node>> args;
};

namespace {

using NodePtr = std::shared_ptr<const Expr::Node>;
using Node = Expr::Node;

struct Token {
  enum class Kind { kNumber, kString, kName, kOp, kEnd } kind = Kind::kEnd;
  std::string text;
  double number = 0.0;
  size_t column = 0;
};

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) { tokenize(); }

  NodePtr parse_all(std::set<std::string>& names) {
    names_ = &names;
    NodePtr n = parse_or();
    if (peek().kind != Token::Kind::kEnd) fail("unexpected '" + peek().text + "'", peek().column);
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what, size_t column) const {
    throw_usage("expression '" + text_ + "': " + what + " at column " + std::to_string(column + 1));
  }

  void tokenize() {
    size_t i = 0;
    while (i < text_.size()) {
      const char c = text_[i];
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i;
        continue;
      }
      Token t;
      t.column = i;
      if (std::isdigit(static_cast<unsigned char>(c)) || (c == '.' && i + 1 < text_.size() && std::isdigit(static_cast<unsigned char>(text_[i + 1])))) {
        char* end = nullptr;
        t.number = std::strtod(text_.c_str() + i, &end);
        const size_t len = static_cast<size_t>(end - (text_.c_str() + i));
        t.kind = Token::Kind::kNumber;
        t.text = text_.substr(i, len);
        i += len;
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[j])) || text_[j] == '_')) ++j;
        t.kind = Token::Kind::kName;
        t.text = text_.substr(i, j - i);
        i = j;
      } else if (c == '\'' || c == '"') {
        const size_t close = text_.find(c, i + 1);
        if (close == std::string::npos) fail("unterminated string", i);
        t.kind = Token::Kind::kString;
        t.text = text_.substr(i + 1, close - i - 1);
        i = close + 1;
      } else {
        static const char* kOps[] = {"==", "!=", "<=", ">=", "&&", "||", "<", ">", "+", "-", "*", "/", "%", "!", "(", ")", ","};
        bool found = false;
        for (const char* op : kOps) {
          const size_t len = std::char_traits<char>::length(op);
          if (text_.compare(i, len, op) == 0) {
            t.kind = Token::Kind::kOp;
            t.text = op;
            i += len;
            found = true;
            break;
          }
        }
        if (!found) fail(std::string("unexpected character '") + c + "'", i);
      }
      tokens_.push_back(t);
    }
    Token end;
    end.column = text_.size();
    tokens_.push_back(end);
  }

  const Token& peek() const { return tokens_[pos_]; }
  bool accept_op(const std::string& op) {
    const Token& t = peek();
    if ((t.kind == Token::Kind::kOp || t.kind == Token::Kind::kName) && t.text == op) {
      ++pos_;
      return true;
    }
    return false;
  }

  static NodePtr make(Node::Kind kind, std::string op, std::vector<NodePtr> args) {
    auto n = std::make_shared<Node>();
    n->kind = kind;
    n->op = std::move(op);
    n->args = std::move(args);
    return n;
  }

  NodePtr parse_or() {
    NodePtr left = parse_and();
    while (accept_op("||") || accept_op("or")) left = make(Node::Kind::kBinary, "or", {left, parse_and()});
    return left;
  }
  NodePtr parse_and() {
    NodePtr left = parse_not();
    while (accept_op("&&") || accept_op("and")) left = make(Node::Kind::kBinary, "and", {left, parse_not()});
    return left;
  }
  NodePtr parse_not() {
    if (accept_op("!") || accept_op("not")) return make(Node::Kind::kUnary, "not", {parse_not()});
    return parse_cmp();
  }
  NodePtr parse_cmp() {
    NodePtr left = parse_add();
    for (const char* op : {"==", "!=", "<=", ">=", "<", ">"}) {
      if (accept_op(op)) {
        NodePtr n = make(Node::Kind::kBinary, op, {left, parse_add()});
        for (const char* again : {"==", "!=", "<=", ">=", "<", ">"}) {
          if (peek().kind == Token::Kind::kOp && peek().text == again) fail("comparisons do not chain; use 'and'", peek().column);
        }
        return n;
      }
    }
    return left;
  }
  NodePtr parse_add() {
    NodePtr left = parse_mul();
    for (;;) {
      if (accept_op("+")) {
        left = make(Node::Kind::kBinary, "+", {left, parse_mul()});
      } else if (accept_op("-")) {
        left = make(Node::Kind::kBinary, "-", {left, parse_mul()});
      } else {
        return left;
      }
    }
  }
  NodePtr parse_mul() {
    NodePtr left = parse_unary();
    for (;;) {
      std::string op;
      for (const char* o : {"*", "/", "%"}) {
        if (op.empty() && accept_op(o)) op = o;
      }
      if (op.empty()) return left;
      left = make(Node::Kind::kBinary, op, {left, parse_unary()});
    }
  }
  NodePtr parse_unary() {
    if (accept_op("-")) return make(Node::Kind::kUnary, "-", {parse_unary()});
    return parse_primary();
  }
  NodePtr parse_primary() {
    const Token t = peek();
    auto lit = [&](ExprValue v) {
      ++pos_;
      auto n = std::make_shared<Node>();
      n->value = std::move(v);
      return NodePtr(n);
    };
    switch (t.kind) {
      case Token::Kind::kNumber:
        return lit(t.number);
      case Token::Kind::kString:
        return lit(t.text);
      case Token::Kind::kName: {
        if (t.text == "true") return lit(true);
        if (t.text == "false") return lit(false);
        if (t.text == "null" || t.text == "none") return lit(nullptr);
        if (t.text == "and" || t.text == "or" || t.text == "not") fail("unexpected '" + t.text + "'", t.column);
        ++pos_;
        if (accept_op("(")) {
          if (t.text != "min" && t.text != "max" && t.text != "abs") fail("unknown function '" + t.text + "' (min, max, abs)", t.column);
          std::vector<NodePtr> args;
          if (!accept_op(")")) {
            do {
              args.push_back(parse_or());
            } while (accept_op(","));
            if (!accept_op(")")) fail("expected ')'", peek().column);
          }
          const size_t want = t.text == "abs" ? 1 : 2;
          if (args.size() < want || (t.text == "abs" && args.size() != 1)) fail(t.text + "() takes " + (want == 1 ? "one argument" : "two or more arguments"), t.column);
          return make(Node::Kind::kCall, t.text, std::move(args));
        }
        names_->insert(t.text);
        return make(Node::Kind::kName, t.text, {});
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          ++pos_;
          NodePtr inner = parse_or();
          if (!accept_op(")")) fail("expected ')'", peek().column);
          return inner;
        }
        fail("unexpected '" + t.text + "'", t.column);
      case Token::Kind::kEnd:
        break;
    }
    fail("unexpected end of expression", t.column);
  }

  std::string text_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::set<std::string>* names_ = nullptr;
};

const char* type_name(const ExprValue& v) {
  switch (v.index()) {
    case 0:
      return "null";
    case 1:
      return "boolean";
    case 2:
      return "number";
    default:
      return "string";
  }
}

struct Evaluator {
  const std::string& text;
  const std::function<std::optional<ExprValue>(const std::string&)>& lookup;

  [[noreturn]] void fail(const std::string& what) const { throw_usage("expression '" + text + "': " + what); }

  double number(const ExprValue& v, const std::string& op) const {
    if (const double* d = std::get_if<double>(&v)) return *d;
    fail("'" + op + "' needs numbers, got " + type_name(v) + " " + expr_value_text(v));
  }
  bool boolean(const ExprValue& v, const std::string& op) const {
    if (const bool* b = std::get_if<bool>(&v)) return *b;
    fail("'" + op + "' needs true/false, got " + type_name(v) + " " + expr_value_text(v));
  }

  ExprValue eval(const Node& n) const {
    switch (n.kind) {
      case Node::Kind::kLiteral:
        return n.value;
      case Node::Kind::kName: {
        std::optional<ExprValue> v = lookup(n.op);
        if (!v) fail("unknown name '" + n.op + "'");
        return *v;
      }
      case Node::Kind::kUnary: {
        const ExprValue v = eval(*n.args[0]);
        if (n.op == "not") return !boolean(v, "not");
        return -number(v, "-");
      }
      case Node::Kind::kCall: {
        std::vector<double> xs;
        for (const auto& a : n.args) xs.push_back(number(eval(*a), n.op + "()"));
        if (n.op == "abs") return std::fabs(xs[0]);
        double r = xs[0];
        for (double x : xs) r = n.op == "min" ? std::min(r, x) : std::max(r, x);
        return r;
      }
      case Node::Kind::kBinary:
        break;
    }
    if (n.op == "and") return boolean(eval(*n.args[0]), "and") && boolean(eval(*n.args[1]), "and");
    if (n.op == "or") return boolean(eval(*n.args[0]), "or") || boolean(eval(*n.args[1]), "or");
    const ExprValue a = eval(*n.args[0]);
    const ExprValue b = eval(*n.args[1]);
    if (n.op == "==") return a == b;
    if (n.op == "!=") return a != b;
    if (n.op == "<" || n.op == "<=" || n.op == ">" || n.op == ">=") {
      int cmp = 0;
      if (a.index() == 2 && b.index() == 2) {
        const double x = std::get<double>(a), y = std::get<double>(b);
        cmp = x < y ? -1 : (x > y ? 1 : 0);
      } else if (a.index() == 3 && b.index() == 3) {
        cmp = std::get<std::string>(a).compare(std::get<std::string>(b));
      } else {
        fail("cannot order " + std::string(type_name(a)) + " " + expr_value_text(a) + " and " + type_name(b) + " " + expr_value_text(b));
      }
      if (n.op == "<") return cmp < 0;
      if (n.op == "<=") return cmp <= 0;
      if (n.op == ">") return cmp > 0;
      return cmp >= 0;
    }
    if (n.op == "+" && a.index() == 3 && b.index() == 3) return std::get<std::string>(a) + std::get<std::string>(b);
    const double x = number(a, n.op), y = number(b, n.op);
    if (n.op == "+") return x + y;
    if (n.op == "-") return x - y;
    if (n.op == "*") return x * y;
    if (y == 0.0) fail("division by zero ('" + n.op + "' by 0)");
    if (n.op == "/") return x / y;
    return std::fmod(x, y);
  }
};

}  // namespace

std::optional<ExprValue> expr_value_of(const nlohmann::ordered_json& j) {
  if (j.is_null()) return ExprValue(nullptr);
  if (j.is_boolean()) return ExprValue(j.get<bool>());
  if (j.is_number()) return ExprValue(j.get<double>());
  if (j.is_string()) return ExprValue(j.get<std::string>());
  return std::nullopt;
}

std::string expr_value_text(const ExprValue& v) {
  switch (v.index()) {
    case 0:
      return "null";
    case 1:
      return std::get<bool>(v) ? "true" : "false";
    case 2: {
      std::ostringstream s;
      s << std::get<double>(v);
      return s.str();
    }
    default:
      return "'" + std::get<std::string>(v) + "'";
  }
}

Expr Expr::parse(const std::string& text) {
  Expr e;
  e.text_ = text;
  Parser p(text);
  e.root_ = p.parse_all(e.names_);
  return e;
}

ExprValue Expr::evaluate(const std::function<std::optional<ExprValue>(const std::string&)>& lookup) const {
  return Evaluator{text_, lookup}.eval(*root_);
}

bool Expr::test(const std::function<std::optional<ExprValue>(const std::string&)>& lookup) const {
  const ExprValue v = evaluate(lookup);
  if (const bool* b = std::get_if<bool>(&v)) return *b;
  throw_usage("expression '" + text_ + "' must be true or false (a comparison), but it gives " + expr_value_text(v));
}

}  // namespace servetune::tuner
