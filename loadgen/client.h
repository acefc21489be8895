// What every load-generator client runs: a plan of requests with scheduled arrival times and a concurrency cap,
// sent from one event loop (the order and timing rules are dispatcher.h's: plain requests, or sessions whose turns
// wait for the previous reply plus a think time); what comes back is one RequestOutput per planned request, in
// plan order.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "datasets/dataset.h"
#include "loadgen/metrics.h"

namespace servetune::loadgen {

struct PlannedRequest {
  const datasets::SampleRequest* sample = nullptr;
  // Seconds after the run starts; non-decreasing along the plan. With sessions only a first turn's counts: a later
  // turn is due think_s after the session's previous turn finished.
  double scheduled_s = 0.0;
  double think_s = 0.0;
};

// Sampling fields sent with every request (unset: the server's default).
struct RequestParams {
  bool ignore_eos = false;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
};

struct RunSpec {
  std::vector<PlannedRequest> requests;
  int64_t max_concurrency = 0;  // 0: unlimited
  RequestParams params;
  bool keep_text = true;        // keep generated text (needed when the server reports no usage)
  // Requests are turns of sessions (SampleRequest::session, consecutive in the plan): max_concurrency counts active
  // sessions and a turn is sent after its session's previous one finished (dispatcher.h).
  bool sessions = false;
  // With sessions, history from the server's replies: re-renders a later turn whose assistant messages were replaced
  // by the replies its session received (needs keep_text). Unset: turns are sent as planned.
  std::function<void(datasets::SampleRequest&)> render;
};

struct RunResult {
  std::vector<RequestOutput> outputs;
  double duration_s = 0.0;  // from the run's start until the last request finished
};

class Client {
 public:
  virtual ~Client() = default;
  virtual RunResult run(const RunSpec& spec) = 0;
};

// Arrival offsets as vLLM's get_request: rate = inf sends everything at 0; otherwise gaps are
// Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) (burstiness 1: Poisson; inf: constant 1/rate),
// accumulated and rescaled so the last arrival is at n / rate.
std::vector<double> arrival_times(size_t n, double rate, double burstiness, uint64_t seed);

}  // namespace servetune::loadgen
