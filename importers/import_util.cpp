// Metric-name mapping, number parsing and the final checks shared by the importers (see import_util.h).
#include "importers/import_util.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "servetune/error.h"

namespace servetune::importers::import_detail {


std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string slug(const std::string& label) {
  std::string out;
  for (char c : label) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (c == '%') {
      out += out.empty() || out.back() == '_' ? "pct" : "_pct";
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

std::string latency_name(const std::string& name) {
  const std::string n = slug(name);
  if (n == "ttft" || n == "time_to_first_token") return "ttft";
  if (n == "tpot") return "tpot";
  if (n == "itl" || n == "inter_token_latency") return "itl";
  if (n == "e2el" || n == "e2e_latency" || n == "e2e" || n == "end_to_end_latency") return "e2el";
  if (n == "client_queue_time") return "client_queue_time";
  if (n == "e2el_incl_client_queue" || n == "e2el_including_client_queue") return "e2el_including_client_queue";
  if (n == "client_lag") return "client_lag";
  if (n == "client_send_lag") return "client_send_lag";
  if (n == "per_token_itl") return "per_token_itl";
  return "";
}

std::string stat_name(const std::string& word) {
  const std::string w = lower(word);
  if (w == "mean" || w == "median" || w == "std" || w == "max" || w == "min") return w;
  if (w.size() >= 2 && w[0] == 'p') {
    const auto v = parse_number(w.substr(1));
    if (v && *v >= 0.0 && *v <= 100.0 && std::isdigit(static_cast<unsigned char>(w[1]))) return w;
  }
  return "";
}

std::optional<double> parse_number(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  if (b == std::string::npos) return std::nullopt;
  const std::string t = s.substr(b, e - b + 1);
  const char c = t[0];
  if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.')) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

nlohmann::ordered_json number_json(double v) {
  if (std::floor(v) == v && std::fabs(v) < 9.0e15) return static_cast<int64_t>(v);
  return v;
}

void finish_result(ImportedResult& r, const std::string& path) {
  auto& m = r.metrics;
  auto num = [&](const char* k) { return m.contains(k) && m[k].is_number() ? std::optional<double>(m[k].get<double>()) : std::nullopt; };
  // "FILE:LINE: " and, for a result inside a JSON document, where in it ("benchmarks[1]: ").
  const bool by_line = r.locator.rfind("line ", 0) == 0;
  const std::string where = path + ":" + std::to_string(r.line) + ": " + (by_line || r.locator.empty() ? "" : r.locator + ": ");
  for (const auto& [k, v] : m.items()) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      throw Error(ErrorKind::kFormat, where + "metric '" + k + "' is not a finite number");
    }
  }
  if (!num("total_token_throughput")) {
    const auto in = num("total_input_tokens"), out = num("total_output_tokens"), d = num("duration");
    if (in && out && d && *d > 0.0) m["total_token_throughput"] = (*in + *out) / *d;
  }
  if (!num("request_throughput")) {
    const auto c = num("completed"), d = num("duration");
    if (c && d && *d > 0.0) m["request_throughput"] = *c / *d;
  }
  for (const char* k : {"completed", "request_throughput", "output_throughput"}) {
    if (!num(k)) throw Error(ErrorKind::kFormat, where + "no '" + k + "' in this result (incomplete or truncated?)");
  }
  if (*num("completed") < 0.0) throw Error(ErrorKind::kFormat, where + "negative number of completed requests");
}

}  // namespace servetune::importers::import_detail
