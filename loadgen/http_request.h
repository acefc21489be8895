// One blocking HTTP request with libcurl's easy interface, for the calls that are not a benchmark's traffic: health
// checks, /metrics scrapes, admin calls, and the perplexity client's JSON POSTs. The streaming benchmark client is
// http_client.h.
#pragma once

#include <optional>
#include <string>

namespace servetune::loadgen {

struct HttpReply {
  std::string transport_error;  // non-empty when no HTTP answer came (refused, timed out, ...); then status is 0
  long status = 0;
  std::string body;
};

// GET `url`, or POST `post_body` (as application/json unless empty) when given; timeout in ms; "Authorization:
// Bearer KEY" when `api_key` is set.
HttpReply http_request(const std::string& url, long timeout_ms, const std::string& api_key = "",
                       const std::string* post_body = nullptr);

// One GET of `url`; the body on HTTP 200, nullopt on any failure.
std::optional<std::string> http_get(const std::string& url, long timeout_ms, const std::string& api_key = "");
// The same as a POST with an empty body (an admin call such as SGLang's /flush_cache).
std::optional<std::string> http_post(const std::string& url, long timeout_ms, const std::string& api_key = "");

}  // namespace servetune::loadgen
