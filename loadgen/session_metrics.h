// Multi-turn metrics of a run: sessions and their completion time, TTFT / TPOT / ITL of first turns against later
// turns (compute_metrics on each subset, so the definitions stay vLLM's), mean TTFT by turn index, the share of
// prompt tokens the server reported as cached (usage.prompt_tokens_details.cached_tokens, or the built-in engine's
// usage), and the prefix-cache hit rate the engine's or server's counters give over the run.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/metrics.h"
#include "loadgen/vllm_multi_turn.h"

namespace servetune::loadgen {

struct SessionMetrics {
  int64_t sessions = 0;
  int64_t completed_sessions = 0;  // every turn succeeded
  double mean_turns = 0.0;         // planned turns per session
  Summary session_time_ms;         // completed sessions: first turn's send to the last turn's last token
  BenchmarkMetrics first_turn;     // turn index 0
  BenchmarkMetrics later_turns;    // turn index >= 1
  std::vector<double> mean_ttft_ms_by_turn;  // successful requests of each turn index
  // Cached prompt tokens / prompt tokens over the successful requests that reported cached tokens; nullopt: none did.
  std::optional<double> reported_cached_fraction_first, reported_cached_fraction_later;
  // The engine's or server's prefix-cache hit rate over the run (set by the caller) and where it comes from.
  std::optional<double> prefix_cache_hit_rate;
  std::string prefix_cache_source;
  // vLLM's multi-turn benchmark's per-request records (set by the caller, which knows the messages sent).
  std::vector<VllmTurnStats> vllm_turns;
};

// Outputs carry their session and turn (RequestOutput::session, turn); duration_s as for compute_metrics.
SessionMetrics compute_session_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                       const std::vector<double>& percentiles,
                                       const std::function<int64_t(const std::string&)>& count_tokens = {});

}  // namespace servetune::loadgen
