// Prometheus text-format metrics of the server: vLLM's metric names where vLLM has the metric (so its dashboards
// work), `servetune:` names for the rest. Counters and histograms are lock-free and updated from the I/O threads.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "servetune/engine.h"

namespace servetune::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Appends name_bucket{le=...}, name_sum and name_count lines (no HELP/TYPE).
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // non-cumulative; the last one is +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

struct ServerMetrics {
  ServerMetrics();
  Histogram ttft;   // seconds from request arrival to the first token
  Histogram itl;    // seconds between token events of a request
  Histogram tpot;   // per request: (last token - first token) / (output tokens - 1)
  Histogram e2e;    // seconds from arrival to the final event
  std::array<std::atomic<int64_t>, 3> finished{};  // stop, length, abort
  std::atomic<int64_t> in_flight{0};               // engine requests (one per choice) submitted and not yet finished
  std::atomic<int64_t> preparing{0};               // requests being parsed and tokenized off the I/O threads
  std::atomic<int64_t> connections_open{0};
  std::atomic<int64_t> connections_total{0};
  std::atomic<int64_t> connections_refused{0};     // over --max-connections
  std::array<std::atomic<int64_t>, 600> responses{};  // by HTTP status code

  void count_response(int status);
  void count_finish(FinishReason r);
};

// The /metrics body for `model_name` from the server's metrics and the engine's stats; the speculative-decoding
// counters only when the engine speculates (as vLLM does), so a scraper can tell "no speculation" from "no drafts".
std::string render_metrics(const ServerMetrics& m, const EngineStats& s, const std::string& model_name, bool speculative);

}  // namespace servetune::server
