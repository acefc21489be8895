// Speculative-decoding counters read from an OpenAI-compatible server's Prometheus /metrics (vLLM's names, which
// `servetune serve` also uses), so an HTTP benchmark reports the "Speculative Decoding" section as vLLM's does:
// the difference of the counters scraped before and after the run.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "loadgen/report.h"

namespace servetune::loadgen {

// One GET of `url` (timeout in ms, optional bearer key); the body on HTTP 200, nullopt on any failure.
std::optional<std::string> http_get(const std::string& url, long timeout_ms, const std::string& api_key = "");

// The vllm:spec_decode_* counters of a Prometheus text exposition, summed over label sets (per position for the
// per-position counter); nullopt when the server exposes no vllm:spec_decode_num_drafts_total (no speculation).
// Malformed lines are skipped.
std::optional<SpecDecodeStats> parse_spec_decode_counters(std::string_view prometheus_text);

// after - before, counter by counter (positions missing before count from 0).
SpecDecodeStats spec_decode_difference(const SpecDecodeStats& after, const SpecDecodeStats& before);

// Scrapes `metrics_url`; nullopt when unreachable or without speculative counters.
std::optional<SpecDecodeStats> scrape_spec_decode(const std::string& metrics_url, const std::string& api_key);

}  // namespace servetune::loadgen
