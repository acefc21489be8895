// One generation request served over HTTP: submits one engine request per choice (n), turns their events into an
// SSE stream or one JSON response, aborts them when the client disconnects (or the task is dropped), and records
// latency metrics. Runs on its connection's executor; the engine thread only posts a wake-up to it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "server/http_server.h"
#include "server/openai_request.h"

namespace servetune {
class Engine;
}

namespace servetune::server {

struct ServerMetrics;

// Engine request ids of the generations in flight, so a shutdown can abort them all.
class InFlight {
 public:
  void add(uint64_t id);
  void remove(uint64_t id);
  std::vector<uint64_t> ids() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_set<uint64_t> ids_;
};

struct GenerationContext {
  Engine& engine;
  ServerMetrics& metrics;
  InFlight& in_flight;
};

// Submits `request` (prompt already tokenized into `prompt_ids`, max_tokens final) as request.n engine requests and
// answers on `exchange`; must run on the exchange's executor. Throws ApiError for a request the engine rejects
// (before anything was sent).
void start_generation(GenerationContext& ctx, GenerateRequest request, std::vector<int32_t> prompt_ids,
                      const std::string& model_name, EngineClock::time_point arrival, std::shared_ptr<Exchange> exchange);

// "cmpl-" / "chatcmpl-" followed by 32 random hex digits.
std::string new_request_id(ApiKind kind);

}  // namespace servetune::server
