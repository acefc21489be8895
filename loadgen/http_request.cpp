// Blocking HTTP requests over libcurl's easy interface (see http_request.h).
#include "loadgen/http_request.h"

#include <curl/curl.h>

namespace servetune::loadgen {
namespace {

size_t append_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

std::optional<std::string> body_if_ok(HttpReply r) {
  if (!r.transport_error.empty() || r.status != 200) return std::nullopt;
  return std::move(r.body);
}

}  // namespace

HttpReply http_request(const std::string& url, long timeout_ms, const std::string& api_key, const std::string* post_body) {
  HttpReply reply;
  CURL* h = curl_easy_init();
  if (h == nullptr) {
    reply.transport_error = "cannot create a libcurl handle";
    return reply;
  }
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_slist* headers = nullptr;
  if (!api_key.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + api_key).c_str());
  if (post_body && !post_body->empty()) headers = curl_slist_append(headers, "Content-Type: application/json");
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply.body);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  if (post_body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, post_body->c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(post_body->size()));
  }
  const CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    reply.transport_error = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
  } else {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &reply.status);
  }
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  return reply;
}

std::optional<std::string> http_get(const std::string& url, long timeout_ms, const std::string& api_key) {
  return body_if_ok(http_request(url, timeout_ms, api_key));
}

std::optional<std::string> http_post(const std::string& url, long timeout_ms, const std::string& api_key) {
  const std::string empty;
  return body_if_ok(http_request(url, timeout_ms, api_key, &empty));
}

}  // namespace servetune::loadgen
