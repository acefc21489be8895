// Request shapes of the HTTP backends (see backends.h).
#include "loadgen/backends.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

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

std::string request_body(const std::string& backend, const std::string& model, const datasets::SampleRequest& r,
                         const RequestParams& params) {
  nlohmann::json j;
  j["model"] = model;
  if (backend_api(backend) == ApiKind::kChat) {
    j["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.prompt}}});
    j["max_completion_tokens"] = r.output_len;
  } else {
    j["prompt"] = r.prompt;
    j["max_tokens"] = r.output_len;
  }
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  if (params.ignore_eos) j["ignore_eos"] = true;
  if (params.temperature) j["temperature"] = *params.temperature;
  if (params.top_p) j["top_p"] = *params.top_p;
  if (params.top_k) j["top_k"] = *params.top_k;
  return j.dump();
}

}  // namespace servetune::loadgen
