// vLLM-compatible result block and JSON (see report.h); the layout follows vllm/benchmarks/serve.py benchmark().
#include "loadgen/report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>

#include "servetune/error.h"

namespace servetune::loadgen {
namespace {

struct MetricInfo {
  const char* key;     // e.g. "ttft"
  const char* name;    // e.g. "TTFT"
  const char* header;  // section title
};

constexpr MetricInfo kMetrics[] = {
    {"ttft", "TTFT", "Time to First Token"},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    {"itl", "ITL", "Inter-token Latency"},
    {"e2el", "E2EL", "End-to-end Latency"},
    {"client_queue_time", "Client Queue Time", "Client-side Queueing"},
    {"e2el_including_client_queue", "E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency"},
    {"client_lag", "Client Lag", "Client Lag (servetune)"},
    {"client_send_lag", "Client Send Lag", "Client Send Lag (servetune)"},
    {"per_token_itl", "Per-token ITL", "Per-token ITL (servetune)"},
};

std::string centered(const std::string& s, char fill) {
  const size_t width = 50;
  if (s.size() >= width) return s;
  const size_t pad = width - s.size(), left = pad / 2;
  return std::string(left, fill) + s + std::string(pad - left, fill);
}

void line_int(std::FILE* out, const std::string& label, int64_t v) {
  std::fprintf(out, "%-40s %-10lld\n", label.c_str(), static_cast<long long>(v));
}
void line_f(std::FILE* out, const std::string& label, double v) { std::fprintf(out, "%-40s %-10.2f\n", label.c_str(), v); }

std::vector<std::string> split_csv(const std::string& csv) {
  std::vector<std::string> parts;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    parts.push_back(item);
  }
  return parts;
}

bool parse_double(const std::string& s, double& v) {
  const char* b = s.data();
  const char* e = b + s.size();
  auto [p, ec] = std::from_chars(b, e, v);
  return ec == std::errc() && p == e && !s.empty();
}

// Which metrics have a section in this run, in vLLM's order: client queue sections need --max-concurrency
// (the E2EL one also a finite rate), exactly as vLLM decides.
bool section_applies(const std::string& key, const ReportOptions& o) {
  if (key == "client_queue_time") return o.max_concurrency > 0;
  if (key == "e2el_including_client_queue") return o.max_concurrency > 0 && !std::isinf(o.request_rate);
  return true;
}

// nullptr: not measured in this run (client lag against a server that sends no send stamps).
const Summary* summary_of(const BenchmarkMetrics& m, const std::string& key) {
  if (key == "ttft") return &m.ttft_ms;
  if (key == "tpot") return &m.tpot_ms;
  if (key == "itl") return &m.itl_ms;
  if (key == "e2el") return &m.e2el_ms;
  if (key == "client_queue_time") return &m.client_queue_time_ms;
  if (key == "e2el_including_client_queue") return &m.e2el_including_client_queue_ms;
  if (key == "client_lag") return m.client_lag_ms ? &*m.client_lag_ms : nullptr;
  if (key == "client_send_lag") return &m.client_send_lag_ms;
  return &m.per_token_itl_ms;
}

// Concatenation by append (gcc 12 reports a false -Wrestrict for chains of operator+ on temporaries).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(parts), ...);
  return s;
}

double acceptance_rate(const SpecDecodeStats& s) {
  return s.draft_tokens > 0 ? 100.0 * static_cast<double>(s.accepted_tokens) / static_cast<double>(s.draft_tokens) : 0.0;
}
double acceptance_length(const SpecDecodeStats& s) {
  return s.num_drafts > 0 ? 1.0 + static_cast<double>(s.accepted_tokens) / static_cast<double>(s.num_drafts) : 1.0;
}
std::vector<double> per_position_rates(const SpecDecodeStats& s) {
  std::vector<double> rates;
  for (int64_t a : s.accepted_per_position) {
    rates.push_back(s.num_drafts > 0 ? static_cast<double>(a) / static_cast<double>(s.num_drafts) : 0.0);
  }
  return rates;
}

bool selected(const ReportOptions& o, const std::string& key) {
  return std::find(o.percentile_metrics.begin(), o.percentile_metrics.end(), key) != o.percentile_metrics.end();
}

}  // namespace

const std::vector<std::string>& percentile_metric_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> v;
    for (const MetricInfo& m : kMetrics) v.emplace_back(m.key);
    return v;
  }();
  return kNames;
}

std::vector<std::string> parse_percentile_metrics(const std::string& csv) {
  std::vector<std::string> out;
  const auto& names = percentile_metric_names();
  for (const std::string& item : split_csv(csv)) {
    if (std::find(names.begin(), names.end(), item) == names.end()) {
      std::string all;
      for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
      throw_usage("--percentile-metrics: unknown metric '" + item + "' (allowed: " + all + ")");
    }
    out.push_back(item);
  }
  return out;
}

std::vector<double> parse_metric_percentiles(const std::string& csv) {
  std::vector<double> out;
  for (const std::string& item : split_csv(csv)) {
    double v = 0.0;
    if (!parse_double(item, v) || !(v >= 0.0 && v <= 100.0)) {
      throw_usage("--metric-percentiles: '" + item + "' is not a number in [0, 100]");
    }
    out.push_back(v);
  }
  if (out.empty()) throw_usage("--metric-percentiles: give at least one percentile");
  return out;
}

GoodputSlo parse_goodput(const std::vector<std::string>& pairs) {
  GoodputSlo slo;
  for (const std::string& pair : pairs) {
    const size_t colon = pair.find(':');
    double v = 0.0;
    if (colon == std::string::npos || !parse_double(pair.substr(colon + 1), v)) {
      throw_usage("--goodput: '" + pair + "' is not KEY:VALUE (e.g. ttft:500, milliseconds)");
    }
    const std::string key = pair.substr(0, colon);
    if (v < 0.0) throw_usage("--goodput: " + key + " must be >= 0 ms");
    if (key == "ttft") {
      slo.ttft = v;
    } else if (key == "tpot") {
      slo.tpot = v;
    } else if (key == "e2el") {
      slo.e2el = v;
    } else {
      throw_usage("--goodput: unknown metric '" + key + "' (allowed: ttft, tpot, e2el)");
    }
  }
  return slo;
}

std::string percentile_word(double p) {
  if (std::floor(p) == p) return std::to_string(static_cast<long long>(p));
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), p);
  return std::string(buf, ec == std::errc() ? end : buf);
}

void print_failures(std::FILE* out, const RunResult& run, const BenchmarkMetrics& m) {
  if (m.failed == 0) return;
  std::fprintf(out, "Failed requests during benchmark run detected (capping to 10):\n");
  int shown = 0;
  for (const RequestOutput& o : run.outputs) {
    if (o.success) continue;
    std::fprintf(out, "Error %d: %s\n", shown, o.error.c_str());
    if (++shown == 10) break;
  }
  std::fprintf(out, "Failure reasons (servetune):\n");
  for (const auto& [reason, count] : m.failure_reasons) {
    std::fprintf(out, "  %6lld x %s\n", static_cast<long long>(count), reason.c_str());
  }
}

void print_result_block(std::FILE* out, const BenchmarkMetrics& m, double duration_s, const ReportOptions& o) {
  std::fprintf(out, "%s\n", centered(" Serving Benchmark Result ", '=').c_str());
  line_int(out, "Successful requests:", m.completed);
  line_int(out, "Failed requests:", m.failed);
  if (o.max_concurrency > 0) line_int(out, "Maximum request concurrency:", o.max_concurrency);
  if (!std::isinf(o.request_rate)) line_f(out, "Request rate configured (RPS):", o.request_rate);
  line_f(out, "Benchmark duration (s):", duration_s);
  line_int(out, "Total input tokens:", m.total_input);
  line_int(out, "Total generated tokens:", m.total_output);
  line_f(out, "Request throughput (req/s):", m.request_throughput);
  if (!o.slo.empty()) line_f(out, "Request goodput (req/s):", m.request_goodput);
  line_f(out, "Output token throughput (tok/s):", m.output_throughput);
  line_f(out, "Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  line_f(out, "Peak concurrent requests:", static_cast<double>(m.max_concurrent_requests));
  line_f(out, "Total token throughput (tok/s):", m.total_token_throughput);
  for (const MetricInfo& info : kMetrics) {
    if (!selected(o, info.key) || !section_applies(info.key, o)) continue;
    const Summary* s = summary_of(m, info.key);
    std::fprintf(out, "%s\n", centered(info.header, '-').c_str());
    if (s == nullptr) {
      std::fprintf(out, "%-40s %s\n", cat(info.name, " (ms):").c_str(), "n/a (the server sent no timestamps)");
      continue;
    }
    line_f(out, cat("Mean ", info.name, " (ms):"), s->mean);
    line_f(out, cat("Median ", info.name, " (ms):"), s->median);
    for (const auto& [p, v] : s->percentiles) line_f(out, cat("P", percentile_word(p), " ", info.name, " (ms):"), v);
  }
  if (o.spec_decode) {
    const SpecDecodeStats& sd = *o.spec_decode;
    std::fprintf(out, "%s\n", centered("Speculative Decoding", '-').c_str());
    line_f(out, "Acceptance rate (%):", acceptance_rate(sd));
    line_f(out, "Acceptance length:", acceptance_length(sd));
    line_int(out, "Drafts:", sd.num_drafts);
    line_int(out, "Draft tokens:", sd.draft_tokens);
    line_int(out, "Accepted tokens:", sd.accepted_tokens);
    if (sd.num_drafts > 0 && sd.draft_seconds > 0.0) line_f(out, "Draft time per draft (ms):", 1000.0 * sd.draft_seconds / static_cast<double>(sd.num_drafts));
    if (sd.disabled_steps > 0) line_int(out, "Steps without drafts:", sd.disabled_steps);
    const std::vector<double> rates = per_position_rates(sd);
    if (!rates.empty()) {
      std::fprintf(out, "Per-position acceptance (%%):\n");
      for (size_t i = 0; i < rates.size(); ++i) line_f(out, cat("  Position ", std::to_string(i), ":"), rates[i] * 100.0);
    }
  }
  if (o.sessions) print_session_block(out, *o.sessions);
  std::fprintf(out, "%s\n", std::string(50, '=').c_str());
}

nlohmann::ordered_json metrics_json(const BenchmarkMetrics& m, const RunResult& run, const ReportOptions& o,
                                    bool detailed) {
  nlohmann::ordered_json j;
  j["duration"] = run.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = o.slo.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(m.request_goodput);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  auto per_request = [&](auto field) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const RequestOutput& r : run.outputs) a.push_back(field(r));
    return a;
  };
  if (detailed) {
    j["input_lens"] = per_request([](const RequestOutput& r) { return r.prompt_len; });
    j["output_lens"] = m.actual_output_lens;
    j["ttfts"] = per_request([](const RequestOutput& r) { return r.ttft; });
    j["itls"] = per_request([](const RequestOutput& r) { return r.itl; });
  }
  j["latencies"] = per_request([](const RequestOutput& r) { return r.latency; });
  if (detailed) j["start_times"] = per_request([](const RequestOutput& r) { return r.start_time; });
  j["queue_times"] = per_request([](const RequestOutput& r) { return r.start_time - r.scheduled_time; });
  if (detailed) {
    j["generated_texts"] = per_request([](const RequestOutput& r) { return r.generated_text; });
    j["errors"] = per_request([](const RequestOutput& r) { return r.error; });
    j["client_lags"] = per_request([](const RequestOutput& r) { return r.read_lags; });
    j["client_send_lags"] =
        per_request([](const RequestOutput& r) { return std::max(0.0, r.start_time - r.ready_time); });
  }
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  j["rtfx"] = 0.0;
  for (const MetricInfo& info : kMetrics) {
    if (!selected(o, info.key) || !section_applies(info.key, o)) continue;
    const Summary* s = summary_of(m, info.key);
    if (s == nullptr) continue;  // no keys rather than zeros that look measured; client_lag_events says 0
    const std::string k = info.key;
    j[cat("mean_", k, "_ms")] = s->mean;
    j[cat("median_", k, "_ms")] = s->median;
    j[cat("std_", k, "_ms")] = s->std;
    for (const auto& [p, v] : s->percentiles) j[cat("p", percentile_word(p), "_", k, "_ms")] = v;
  }
  j["client_lag_events"] = m.client_lag_events;
  if (o.spec_decode) {
    const SpecDecodeStats& sd = *o.spec_decode;
    j["spec_decode_acceptance_rate"] = acceptance_rate(sd);
    j["spec_decode_acceptance_length"] = acceptance_length(sd);
    j["spec_decode_num_drafts"] = sd.num_drafts;
    j["spec_decode_draft_tokens"] = sd.draft_tokens;
    j["spec_decode_accepted_tokens"] = sd.accepted_tokens;
    j["spec_decode_per_position_acceptance_rates"] = per_position_rates(sd);
    j["spec_decode_draft_seconds"] = sd.draft_seconds;
    j["spec_decode_draft_ms_per_draft"] = sd.num_drafts > 0 ? 1000.0 * sd.draft_seconds / static_cast<double>(sd.num_drafts) : 0.0;
    j["spec_decode_disabled_steps"] = sd.disabled_steps;
  }
  nlohmann::ordered_json reasons = nlohmann::ordered_json::object();
  for (const auto& [reason, count] : m.failure_reasons) reasons[reason] = count;
  j["failure_reasons"] = reasons;
  int64_t mismatched = 0;
  for (const RequestOutput& r : run.outputs) {
    if (r.success && r.prompt_len != r.dataset_prompt_len) ++mismatched;
  }
  j["prompt_len_mismatches"] = mismatched;  // server-reported prompt tokens != the dataset's count
  if (o.sessions) {
    j.update(session_metrics_json(*o.sessions));
    if (detailed) j["multi_turn_requests"] = vllm_multi_turn_requests(o.sessions->vllm_turns);
  }
  return j;
}

namespace {

// (label, key, summary) of the per-turn-index latency lines, first turns then later ones.
struct TurnSummary {
  const char* label;   // e.g. "TTFT, first turn"
  const char* prefix;  // JSON: prefix + "mean_" + metric + "_ms"
  const char* metric;
  const Summary* summary;
};
std::vector<TurnSummary> turn_summaries(const SessionMetrics& s) {
  return {{"TTFT, first turn", "first_turn_", "ttft", &s.first_turn.ttft_ms},
          {"TTFT, later turns", "later_turns_", "ttft", &s.later_turns.ttft_ms},
          {"TPOT, first turn", "first_turn_", "tpot", &s.first_turn.tpot_ms},
          {"TPOT, later turns", "later_turns_", "tpot", &s.later_turns.tpot_ms},
          {"ITL, first turn", "first_turn_", "itl", &s.first_turn.itl_ms},
          {"ITL, later turns", "later_turns_", "itl", &s.later_turns.itl_ms}};
}

}  // namespace

void print_session_block(std::FILE* out, const SessionMetrics& s) {
  std::fprintf(out, "%s\n", centered("Multi-turn Sessions (servetune)", '-').c_str());
  line_int(out, "Sessions:", s.sessions);
  line_int(out, "Completed sessions:", s.completed_sessions);
  line_f(out, "Turns per session (mean):", s.mean_turns);
  std::fprintf(out, "%-40s %lld / %lld\n", "Successful turns (first / later):",
               static_cast<long long>(s.first_turn.completed), static_cast<long long>(s.later_turns.completed));
  line_f(out, "Mean session time (ms):", s.session_time_ms.mean);
  line_f(out, "Median session time (ms):", s.session_time_ms.median);
  for (const auto& [p, v] : s.session_time_ms.percentiles) line_f(out, cat("P", percentile_word(p), " session time (ms):"), v);
  for (const TurnSummary& t : turn_summaries(s)) {
    line_f(out, cat("Mean ", t.label, " (ms):"), t.summary->mean);
    for (const auto& [p, v] : t.summary->percentiles) line_f(out, cat("P", percentile_word(p), " ", t.label, " (ms):"), v);
  }
  if (s.reported_cached_fraction_first) line_f(out, "Cached prompt tokens, first turn (%):", 100.0 * *s.reported_cached_fraction_first);
  if (s.reported_cached_fraction_later) line_f(out, "Cached prompt tokens, later turns (%):", 100.0 * *s.reported_cached_fraction_later);
  if (s.prefix_cache_hit_rate) {
    line_f(out, "Prefix cache hit rate (%):", 100.0 * *s.prefix_cache_hit_rate);
    std::fprintf(out, "  (%s)\n", s.prefix_cache_source.c_str());
  } else {
    std::fprintf(out, "%-40s %s\n", "Prefix cache hit rate (%):", "n/a (no engine or server counters)");
  }
  // vLLM's multi-turn benchmark prints these two under these names (its rules: vllm_multi_turn.h).
  const nlohmann::ordered_json vllm = vllm_multi_turn_summary(s.vllm_turns);
  line_f(out, "runtime_sec (vLLM multi-turn):", vllm["runtime_sec"].get<double>());
  line_f(out, "requests_per_sec (vLLM multi-turn):", vllm["requests_per_sec"].get<double>());
}

nlohmann::ordered_json session_metrics_json(const SessionMetrics& s) {
  nlohmann::ordered_json j;
  j["num_sessions"] = s.sessions;
  j["completed_sessions"] = s.completed_sessions;
  j["mean_turns_per_session"] = s.mean_turns;
  j["first_turn_completed"] = s.first_turn.completed;
  j["later_turns_completed"] = s.later_turns.completed;
  j["mean_session_time_ms"] = s.session_time_ms.mean;
  j["median_session_time_ms"] = s.session_time_ms.median;
  j["std_session_time_ms"] = s.session_time_ms.std;
  for (const auto& [p, v] : s.session_time_ms.percentiles) j[cat("p", percentile_word(p), "_session_time_ms")] = v;
  for (const TurnSummary& t : turn_summaries(s)) {
    j[cat(t.prefix, "mean_", t.metric, "_ms")] = t.summary->mean;
    j[cat(t.prefix, "median_", t.metric, "_ms")] = t.summary->median;
    for (const auto& [p, v] : t.summary->percentiles) j[cat(t.prefix, "p", percentile_word(p), "_", t.metric, "_ms")] = v;
  }
  j["mean_ttft_ms_by_turn"] = s.mean_ttft_ms_by_turn;
  if (s.reported_cached_fraction_first) j["first_turn_cached_fraction"] = *s.reported_cached_fraction_first;
  if (s.reported_cached_fraction_later) j["later_turns_cached_fraction"] = *s.reported_cached_fraction_later;
  if (s.prefix_cache_hit_rate) {
    j["prefix_cache_hit_rate"] = *s.prefix_cache_hit_rate;
    j["prefix_cache_hit_rate_source"] = s.prefix_cache_source;
  }
  j.update(vllm_multi_turn_summary(s.vllm_turns));
  return j;
}

}  // namespace servetune::loadgen
