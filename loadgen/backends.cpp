// Request shapes of the HTTP backends (see backends.h).
#include "loadgen/backends.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "servetune/error.h"

namespace servetune::loadgen {

const std::vector<std::string>& http_backends() {
  static const std::vector<std::string> kBackends = {"openai", "openai-chat", "vllm", "sglang", "llama.cpp"};
  return kBackends;
}

bool is_http_backend(const std::string& backend) {
  const auto& b = http_backends();
  return std::find(b.begin(), b.end(), backend) != b.end();
}

ApiKind backend_api(const std::string& backend) {
  return backend == "openai-chat" ? ApiKind::kChat : ApiKind::kCompletions;
}

std::string default_endpoint(const std::string& backend) {
  return backend_api(backend) == ApiKind::kChat ? "/v1/chat/completions" : "/v1/completions";
}

void validate_endpoint(const std::string& backend, const std::string& api_url) {
  const std::string suffix = backend_api(backend) == ApiKind::kChat ? "chat/completions" : "completions";
  const bool ok = api_url.size() >= suffix.size() && api_url.compare(api_url.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (!ok) throw_usage("--backend " + backend + " needs an endpoint ending in '" + suffix + "', got " + api_url);
}

// Written directly (once per request, so without a JSON DOM), members in the sorted order nlohmann::json's
// object uses; strings are escaped and numbers formatted by nlohmann.
std::string request_body(const std::string& backend, const std::string& model, const datasets::SampleRequest& r,
                         const RequestParams& params) {
  const auto quoted = [](const std::string& s) { return nlohmann::json(s).dump(); };
  const bool chat = backend_api(backend) == ApiKind::kChat;
  std::string b = "{";
  if (params.ignore_eos) b += "\"ignore_eos\":true,";
  b += chat ? "\"max_completion_tokens\":" : "\"max_tokens\":";
  b += std::to_string(r.output_len);
  if (chat && !r.messages.empty()) {
    // A multi-turn turn: its whole history, for the server's chat template.
    b += ",\"messages\":[";
    for (size_t i = 0; i < r.messages.size(); ++i) {
      b += (i > 0 ? ",{\"content\":" : "{\"content\":") + quoted(r.messages[i].content) +
           ",\"role\":" + quoted(r.messages[i].role) + "}";
    }
    b += "],\"model\":" + quoted(model);
  } else if (chat) {
    b += ",\"messages\":[{\"content\":" + quoted(r.prompt) + ",\"role\":\"user\"}],\"model\":" + quoted(model);
  } else {
    b += ",\"model\":" + quoted(model) + ",\"prompt\":" + quoted(r.prompt);
  }
  b += ",\"stream\":true,\"stream_options\":{\"include_usage\":true}";
  if (params.temperature) b += ",\"temperature\":" + nlohmann::json(*params.temperature).dump();
  if (params.top_k) b += ",\"top_k\":" + std::to_string(*params.top_k);
  if (params.top_p) b += ",\"top_p\":" + nlohmann::json(*params.top_p).dump();
  b += "}";
  return b;
}

}  // namespace servetune::loadgen
