// Benchmark metrics with vLLM's definitions (vllm/benchmarks/serve.py calculate_metrics): TTFT, TPOT, ITL, E2EL,
// throughputs over the measured wall time, peak output throughput over 1 s buckets, peak concurrency by sweep
// line, goodput against SLOs; percentiles as numpy's default (linear). Times are in seconds, summaries in ms.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace servetune::loadgen {

// Why a request failed, classified by the client where the failure is seen (the error text has the details).
enum class RequestFailure {
  kNone,
  kTimedOut,     // no complete response within the client's request timeout
  kTransport,    // the connection could not be made or broke (refused, reset, DNS, ...)
  kHttpStatus,   // the server answered with a status other than 200
  kBadResponse,  // a malformed or incomplete stream: bad SSE or JSON, no content chunk, no [DONE]
  kServerError,  // the server (or the built-in engine) reported an error for the request
  kRejected,     // the built-in engine refused the request when it was submitted
  kAborted,      // the built-in engine aborted the request
  kNotSent,      // a later turn of a session whose earlier turn failed (sent by neither client)
};

// What one request produced, measured by a client. Times are seconds on the run's clock (0 = run start).
struct RequestOutput {
  bool success = false;
  RequestFailure failure = RequestFailure::kNone;  // why it failed (kNone when it succeeded)
  std::string error;
  int64_t prompt_len = 0;        // the server's usage.prompt_tokens when reported, else the dataset's count
  int64_t dataset_prompt_len = 0;
  int64_t output_tokens = 0;     // usage.completion_tokens (or counted tokens in-process); 0: unknown
  double ttft = 0.0;
  double latency = 0.0;          // last content chunk - start
  std::vector<double> itl;       // gaps between consecutive content chunks
  std::vector<int32_t> chunk_tokens;  // tokens in each content chunk when known (in-process), else empty
  double start_time = 0.0;       // when the request was handed to the transport
  double scheduled_time = 0.0;   // its arrival time in the plan
  double ready_time = 0.0;       // max(scheduled_time, when a concurrency slot freed): the earliest it could go
  // How late the client read each event: its read time minus the time the server stamped on it (same host, same
  // clock); only events that carried a stamp, so empty against servers that send none.
  std::vector<double> read_lags;
  std::string generated_text;
  int64_t session = -1;       // multi-turn: the request's session (-1: none) and turn index from 0
  int64_t turn = 0;
  int64_t cached_tokens = -1;  // prompt tokens the server served from its prefix cache, when reported; else -1
};

struct Summary {
  double mean = 0.0;
  double median = 0.0;
  double std = 0.0;
  std::vector<std::pair<double, double>> percentiles;  // (p, value)
};

struct GoodputSlo {  // milliseconds
  std::optional<double> ttft;
  std::optional<double> tpot;
  std::optional<double> e2el;
  bool empty() const { return !ttft && !tpot && !e2el; }
};

struct BenchmarkMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double request_throughput = 0.0;
  double request_goodput = 0.0;
  double output_throughput = 0.0;
  double total_token_throughput = 0.0;
  Summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  double max_output_tokens_per_s = 0.0;
  int64_t max_concurrent_requests = 0;
  std::vector<int64_t> actual_output_lens;  // per request, 0 for failures
  // servetune additions
  std::optional<Summary> client_lag_ms;  // read lags of every stamped event (failed requests too); none: no stamps
  int64_t client_lag_events = 0;         // events with a send stamp
  Summary client_send_lag_ms;            // start_time - ready_time: how late the client sent each request
  Summary client_queue_time_ms;  // start_time - scheduled_time (vLLM's client_queue_time)
  Summary e2el_including_client_queue_ms;
  Summary per_token_itl_ms;      // each chunk gap spread over the tokens it carried
  std::map<std::string, int64_t> failure_reasons;
};

// numpy.percentile(values, p) with the default linear method; values need not be sorted; 0 for no values.
double percentile_linear(std::vector<double> values, double p);
// mean / median / population std / percentiles of `values` (seconds) in milliseconds; zeros when empty, as
// vLLM's `np.mean(x or 0)`.
Summary summarize_ms(const std::vector<double>& values, const std::vector<double>& percentiles);

// count_tokens: tokens of a generated text, used when the server reported no completion_tokens (vLLM does the
// same with its tokenizer); may be empty, then such a request counts 1 output token.
BenchmarkMetrics compute_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                 const std::vector<double>& percentiles, const GoodputSlo& slo,
                                 const std::function<int64_t(const std::string&)>& count_tokens = {});

// The first line of an error, trimmed to 200 characters: the key failures are grouped by.
std::string failure_reason(const std::string& error);

}  // namespace servetune::loadgen
