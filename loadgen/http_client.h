// Client for OpenAI-compatible servers: every request is a streaming POST driven by libcurl's multi interface on
// one epoll loop (no thread per request); arrivals are timed with a timerfd. SSE is parsed as bytes arrive and each
// read is timestamped when it is handed to the parser. Failures (transport errors, HTTP status, malformed SSE or
// JSON, server error events, a stream ending without [DONE], timeouts) fail that request with a reason. The client
// keeps its connections (and libcurl handles) between runs, like an HTTP session; they close when it is destroyed.
#pragma once

#include <memory>
#include <string>

#include "loadgen/client.h"

namespace servetune::loadgen {

struct HttpClientOptions {
  std::string backend = "openai";
  std::string api_url;  // base URL + endpoint
  std::string model;    // the "model" field
  std::string api_key;  // sent as "Authorization: Bearer KEY" when set
  double request_timeout_s = 6 * 3600.0;
};

class HttpClient : public Client {
 public:
  explicit HttpClient(HttpClientOptions options);
  ~HttpClient() override;
  RunResult run(const RunSpec& spec) override;

 private:
  struct Pool;
  HttpClientOptions options_;
  std::unique_ptr<Pool> pool_;
};

// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit in force afterwards.
long raise_open_file_limit();

}  // namespace servetune::loadgen
