// The result of a benchmark run as `vllm bench serve` prints and saves it (same block text, same JSON keys in the
// same order), plus servetune's additions under their own names: client read and send lag, per-token ITL, failure
// reasons, dataset facts, environment and engine config.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/client.h"
#include "loadgen/metrics.h"
#include "loadgen/session_metrics.h"

namespace servetune::loadgen {

// Speculative-decoding counters of the measured run (engine stats after minus before), for vLLM's section.
struct SpecDecodeStats {
  int64_t num_drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;
  double draft_seconds = 0.0;  // time proposing drafts (servetune's engine and servers; 0 where unknown)
  int64_t disabled_steps = 0;  // steps without drafts by speculative_disable_by_batch_size
};

struct ReportOptions {
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl", "client_lag", "client_send_lag"};
  std::vector<double> percentiles = {99.0};
  int64_t max_concurrency = 0;  // 0: none
  double request_rate = 0.0;    // inf allowed
  double burstiness = 1.0;
  GoodputSlo slo;
  std::optional<SpecDecodeStats> spec_decode;  // set when the engine speculates: "Speculative Decoding" section + keys
  std::optional<SessionMetrics> sessions;      // multi-turn workloads: "Multi-turn Sessions" section + keys
};

// Metric names --percentile-metrics accepts: vLLM's plus client_lag (how late the client read events),
// client_send_lag (how late it sent requests) and per_token_itl.
const std::vector<std::string>& percentile_metric_names();
// Parses "ttft,tpot" (names checked) and "25,50,99" (each in [0, 100]); throws Error(kUsage).
std::vector<std::string> parse_percentile_metrics(const std::string& csv);
std::vector<double> parse_metric_percentiles(const std::string& csv);
// Parses vLLM's --goodput "KEY:VALUE" pairs (ttft / tpot / e2el, milliseconds, >= 0); throws Error(kUsage).
GoodputSlo parse_goodput(const std::vector<std::string>& pairs);

// Python's str(float) for a percentile: "99", "99.9".
std::string percentile_word(double p);

// "Failed requests during benchmark run detected" lines (first 10 errors) and grouped reasons.
void print_failures(std::FILE* out, const RunResult& run, const BenchmarkMetrics& m);
void print_result_block(std::FILE* out, const BenchmarkMetrics& m, double duration_s, const ReportOptions& o);

// The metric part of vLLM's result JSON (duration ... percentiles) plus the servetune metric additions;
// `detailed` adds the per-request arrays vLLM saves with --save-detailed.
nlohmann::ordered_json metrics_json(const BenchmarkMetrics& m, const RunResult& run, const ReportOptions& o,
                                    bool detailed);

// The "Multi-turn Sessions" section of the result block (print_result_block prints it when o.sessions is set).
void print_session_block(std::FILE* out, const SessionMetrics& s);

// Its JSON keys (metrics_json adds them when o.sessions is set): num_sessions, completed_sessions, mean_turns_per_session, {mean,median,std,pNN}_session_time_ms,
// first_turn_ / later_turns_ + {mean,median,pNN}_{ttft,tpot,itl}_ms (e.g. later_turns_p99_ttft_ms), mean_ttft_ms_by_turn, the reported cached
// fractions, prefix_cache_hit_rate with prefix_cache_hit_rate_source when known, and vLLM's multi-turn summary
// (runtime_sec, requests_per_sec, multi_turn_statistics: vllm_multi_turn.h); metrics_json with `detailed` adds
// vLLM's per-request records as multi_turn_requests.
nlohmann::ordered_json session_metrics_json(const SessionMetrics& s);

// cpu_model, logical_cpus, os, hostname, servetune_version, git_commit (when the source tree is a git checkout).
nlohmann::ordered_json environment_json(const std::string& servetune_version);

}  // namespace servetune::loadgen
