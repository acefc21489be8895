// Counters read from an OpenAI-compatible server's Prometheus /metrics (vLLM's names, which `servetune serve` also
// uses; SGLang's cache hit rate), so an HTTP benchmark reports the "Speculative Decoding" section as vLLM's does and
// the prefix-cache hit rate: the difference of the counters scraped before and after the run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "loadgen/http_request.h"  // http_get, which the scrapes use
#include "loadgen/report.h"

namespace servetune::loadgen {

// The vllm:spec_decode_* counters of a Prometheus text exposition, summed over label sets (per position for the
// per-position counter); nullopt when the server exposes no vllm:spec_decode_num_drafts_total (no speculation).
// Malformed lines are skipped.
std::optional<SpecDecodeStats> parse_spec_decode_counters(std::string_view prometheus_text);

// after - before, counter by counter (positions missing before count from 0).
SpecDecodeStats spec_decode_difference(const SpecDecodeStats& after, const SpecDecodeStats& before);

// Prefix-cache counters: vLLM's vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (prompt tokens
// looked up / found, summed over label sets) or SGLang's sglang:cache_hit_rate gauge; nullopt when neither is there.
struct PrefixCacheCounters {
  bool has_counters = false;  // vLLM's counters were present
  int64_t queries = 0;
  int64_t hits = 0;
  std::optional<double> sglang_hit_rate;
};
std::optional<PrefixCacheCounters> parse_prefix_cache_counters(std::string_view prometheus_text);

struct PrefixCacheHitRate {
  double rate = 0.0;   // cached prompt tokens / prompt tokens looked up, 0..1
  std::string source;  // where it comes from (the metric names)
};
// Over the run: vLLM's counters after - before; else SGLang's gauge after the run (SGLang's own window, not the
// run's). nullopt when the server looked up no tokens or exposes neither.
std::optional<PrefixCacheHitRate> prefix_cache_hit_rate(const PrefixCacheCounters& before,
                                                        const PrefixCacheCounters& after);

// The /metrics text at `metrics_url` (5 s timeout); nullopt when unreachable.
std::optional<std::string> scrape_metrics(const std::string& metrics_url, const std::string& api_key);

}  // namespace servetune::loadgen
