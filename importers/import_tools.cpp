// GuideLLM ({"benchmarks": [...]}) and AIPerf ({"request_throughput": {"avg"}, ...}) exports, mapped where the
// definitions agree with vLLM's (TPOT = their inter-token latency, throughputs = totals / duration).
#include <cmath>
#include <set>

#include "importers/import_util.h"
#include "servetune/error.h"

namespace servetune::importers::import_detail {

namespace {

[[noreturn]] void fail(const std::string& path, int line, const std::string& where, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ":" + std::to_string(line) + ": " + where + ": " + what);
}

std::optional<double> num_at(const nlohmann::ordered_json& j, std::initializer_list<const char*> keys) {
  const nlohmann::ordered_json* p = &j;
  for (const char* k : keys) {
    if (!p->is_object() || !p->contains(k)) return std::nullopt;
    p = &(*p)[k];
  }
  return p->is_number() ? std::optional<double>(p->get<double>()) : std::nullopt;
}

// GuideLLM percentile keys: p001 = 0.1, p01 = 1, p05 = 5, p10 = 10, ..., p999 = 99.9.
std::string guidellm_percentile(const std::string& key) {
  if (key.size() < 3 || key[0] != 'p') return "";
  const std::string d = key.substr(1);
  if (d.find_first_not_of("0123456789") != std::string::npos) return "";
  if (d.size() == 3) {
    const int v = std::stoi(d);
    return "p" + std::to_string(v / 10) + (v % 10 ? "." + std::to_string(v % 10) : "");
  }
  return "p" + std::to_string(std::stoi(d));
}

// {"successful": {"mean", "median", "std_dev", "percentiles": {...}}} -> mean_/median_/std_/pNN_<name>_ms.
void guidellm_stats(const nlohmann::ordered_json& dist, const std::string& name, double scale, ImportedResult& r) {
  if (!dist.is_object() || !dist.contains("successful") || !dist["successful"].is_object()) return;
  const auto& s = dist["successful"];
  if (s.value("count", 1) == 0) return;
  auto put = [&](const std::string& stat, const nlohmann::ordered_json& v) {
    if (v.is_number()) r.metrics[stat + "_" + name + "_ms"] = v.get<double>() * scale;
  };
  if (s.contains("mean")) put("mean", s["mean"]);
  if (s.contains("median")) put("median", s["median"]);
  if (s.contains("std_dev")) put("std", s["std_dev"]);
  if (s.contains("max")) put("max", s["max"]);
  if (s.contains("percentiles") && s["percentiles"].is_object()) {
    for (const auto& [k, v] : s["percentiles"].items()) {
      const std::string p = guidellm_percentile(k);
      if (!p.empty()) put(p, v);
    }
  }
}

}  // namespace

bool looks_like_guidellm(const nlohmann::ordered_json& j) {
  return j.is_object() && j.contains("benchmarks") && j["benchmarks"].is_array();
}

bool looks_like_aiperf(const nlohmann::ordered_json& j) {
  if (!j.is_object()) return false;
  const auto& m = j.contains("records") && j["records"].is_object() ? j["records"] : j;
  return m.contains("request_throughput") && m["request_throughput"].is_object() &&
         (m["request_throughput"].contains("avg") || m["request_throughput"].contains("value"));
}

std::vector<ImportedResult> parse_guidellm(const nlohmann::ordered_json& j, const std::string& path, int line) {
  std::vector<ImportedResult> out;
  const auto& list = j["benchmarks"];
  if (list.empty()) fail(path, line, "benchmarks", "a GuideLLM export without benchmarks");
  nlohmann::ordered_json version;
  if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("guidellm_version")) version = j["metadata"]["guidellm_version"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "benchmarks[" + std::to_string(i) + "]";
    const auto& b = list[i];
    if (!b.is_object() || !b.contains("metrics") || !b["metrics"].is_object()) fail(path, line, where, "no 'metrics' object (truncated?)");
    const auto& m = b["metrics"];
    const auto& totals = m.contains("request_totals") ? m["request_totals"] : b.value("request_totals", nlohmann::ordered_json());
    const auto ok = num_at(totals, {"successful"});
    if (!ok) fail(path, line, where, "no request_totals.successful");
    std::optional<double> duration = num_at(b, {"duration"});
    if (!duration) {
      const auto s = num_at(b, {"start_time"}), e = num_at(b, {"end_time"});
      if (s && e) duration = *e - *s;
    }
    if (!duration || *duration <= 0.0) fail(path, line, where, "no positive 'duration' (or start_time / end_time)");
    ImportedResult r;
    r.format = "guidellm-json";
    r.line = line;
    r.locator = where;
    r.metrics["duration"] = *duration;
    r.metrics["completed"] = number_json(*ok);
    if (const auto e = num_at(totals, {"errored"})) r.metrics["failed"] = number_json(*e);
    const auto in = num_at(m, {"prompt_token_count", "successful", "total_sum"});
    const auto outt = num_at(m, {"output_token_count", "successful", "total_sum"});
    if (!outt) fail(path, line, where, "no metrics.output_token_count.successful.total_sum");
    if (in) r.metrics["total_input_tokens"] = number_json(*in);
    r.metrics["total_output_tokens"] = number_json(*outt);
    r.metrics["request_throughput"] = *ok / *duration;
    r.metrics["output_throughput"] = *outt / *duration;
    if (in) r.metrics["total_token_throughput"] = (*in + *outt) / *duration;
    guidellm_stats(m.value("time_to_first_token_ms", nlohmann::ordered_json()), "ttft", 1.0, r);
    guidellm_stats(m.value("inter_token_latency_ms", nlohmann::ordered_json()), "tpot", 1.0, r);
    guidellm_stats(m.value("request_latency", nlohmann::ordered_json()), "e2el", 1000.0, r);  // seconds
    for (const char* k : {"requests_per_second", "request_concurrency", "output_tokens_per_second", "tokens_per_second",
                          "time_per_output_token_ms", "prompt_tokens_per_second"}) {
      if (const auto v = num_at(m, {k, "successful", "mean"})) r.extra["mean_" + std::string(k)] = *v;
    }
    if (const auto v = num_at(totals, {"incomplete"})) r.extra["incomplete_requests"] = number_json(*v);
    const nlohmann::ordered_json& cfg = b.contains("config") ? b["config"] : b.value("args", nlohmann::ordered_json());
    if (cfg.is_object() && cfg.contains("strategy") && cfg["strategy"].is_object()) {
      const auto& st = cfg["strategy"];
      r.extra["strategy"] = st.value("type_", std::string());
      if (const auto c = num_at(st, {"max_concurrency"})) {
        r.workload["max_concurrency"] = number_json(*c);
      } else if (const auto c2 = num_at(st, {"streams"})) {
        r.workload["max_concurrency"] = number_json(*c2);
      }
      if (const auto rate = num_at(st, {"rate"})) r.workload["request_rate"] = *rate;
    }
    if (!version.is_null()) r.source["tool_version"] = version;
    r.source["tool"] = "guidellm";
    finish_result(r, path);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<ImportedResult> parse_aiperf(const nlohmann::ordered_json& j, const std::string& path, int line) {
  const auto& m = j.contains("records") && j["records"].is_object() ? j["records"] : j;
  auto avg = [&](const char* k) -> std::optional<double> {
    if (!m.contains(k) || !m[k].is_object()) return std::nullopt;
    const auto v = num_at(m[k], {"avg"});
    return v ? v : num_at(m[k], {"value"});
  };
  // Latencies to ms by their unit.
  auto scale_of = [&](const nlohmann::ordered_json& s) {
    const std::string u = s.value("unit", std::string("ms"));
    return u == "s" || u == "sec" ? 1000.0 : (u == "ns" ? 1e-6 : (u == "us" ? 1e-3 : 1.0));
  };
  ImportedResult r;
  r.format = "aiperf-json";
  r.line = line;
  r.locator = "line " + std::to_string(line);
  const auto duration = avg("benchmark_duration");
  const auto count = avg("request_count");
  const auto rps = avg("request_throughput");
  const auto ots = avg("output_token_throughput");
  if (!rps) fail(path, line, "request_throughput", "no 'avg'");
  if (!count) fail(path, line, "request_count", "missing (an AIPerf export without its request count: truncated?)");
  if (!ots) fail(path, line, "output_token_throughput", "missing (was the run streaming?)");
  if (duration) r.metrics["duration"] = *duration * (m["benchmark_duration"].value("unit", std::string("sec")) == "ms" ? 1e-3 : 1.0);
  r.metrics["completed"] = number_json(*count);
  if (const auto e = avg("error_request_count")) r.metrics["failed"] = number_json(*e);
  if (const auto v = avg("total_isl")) r.metrics["total_input_tokens"] = number_json(*v);
  if (const auto v = avg("total_osl")) r.metrics["total_output_tokens"] = number_json(*v);
  r.metrics["request_throughput"] = *rps;
  r.metrics["output_throughput"] = *ots;
  if (const auto v = avg("total_token_throughput")) r.metrics["total_token_throughput"] = *v;
  if (const auto v = avg("goodput"); v && m.contains("goodput") && m["goodput"].is_object()) r.metrics["request_goodput"] = *v;
  const std::pair<const char*, const char*> latencies[] = {
      {"time_to_first_token", "ttft"}, {"inter_token_latency", "tpot"}, {"request_latency", "e2el"}, {"inter_chunk_latency", "itl"}};
  for (const auto& [key, name] : latencies) {
    if (!m.contains(key) || !m[key].is_object()) continue;
    const auto& s = m[key];
    const double scale = scale_of(s);
    for (const auto& [k, v] : s.items()) {
      if (!v.is_number()) continue;
      const std::string stat = k == "avg" ? "mean" : (k == "p50" ? "median" : k);
      if (stat_name(stat).empty()) continue;
      r.metrics[stat + "_" + std::string(name) + "_ms"] = v.get<double>() * scale;
      if (k == "p50") r.metrics["p50_" + std::string(name) + "_ms"] = v.get<double>() * scale;
    }
  }
  static const std::set<std::string> kUsed = {"benchmark_duration", "request_count", "request_throughput", "output_token_throughput",
                                              "error_request_count", "total_isl", "total_osl", "total_token_throughput", "goodput",
                                              "time_to_first_token", "inter_token_latency", "request_latency", "inter_chunk_latency",
                                              "input_config", "telemetry_data", "records"};
  for (const auto& [k, v] : m.items()) {
    if (kUsed.count(k) || v.is_null()) continue;
    if (v.is_object() && v.contains("avg")) {
      r.extra[k] = {{"avg", v["avg"]}, {"unit", v.value("unit", std::string())}};
    } else if (!v.is_object() && !v.is_array()) {
      r.extra[k] = v;
    }
  }
  const auto& cfg = j.value("input_config", nlohmann::ordered_json());
  if (cfg.is_object()) {
    if (const auto c = num_at(cfg, {"loadgen", "concurrency"})) r.workload["max_concurrency"] = number_json(*c);
    if (const auto rate = num_at(cfg, {"loadgen", "request_rate"})) r.workload["request_rate"] = *rate;
    if (cfg.contains("endpoint") && cfg["endpoint"].is_object() && cfg["endpoint"].contains("model_names") &&
        cfg["endpoint"]["model_names"].is_array() && !cfg["endpoint"]["model_names"].empty()) {
      r.source["model"] = cfg["endpoint"]["model_names"][0];
    }
    if (cfg.contains("cli_command") && cfg["cli_command"].is_string()) r.extra["cli_command"] = cfg["cli_command"];
  }
  r.source["tool"] = "aiperf";
  finish_result(r, path);
  return {r};
}

}  // namespace servetune::importers::import_detail
