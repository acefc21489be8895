// Request bodies of the HTTP backends: byte for byte what a nlohmann::json object of the same fields dumps.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loadgen/backends.h"

namespace servetune::loadgen {
namespace {

std::string via_dom(const std::string& backend, const std::string& model, const datasets::SampleRequest& r,
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

TEST(RequestBody, SameBytesAsTheJsonObject) {
  datasets::SampleRequest r;
  r.output_len = 128;
  RequestParams sampling{true, 0.7, 0.95, 40};
  for (const std::string prompt : {"hello", "quote \" backslash \\ newline \n tab \t ctrl \x01 é 😀", ""}) {
    r.prompt = prompt;
    for (const std::string backend : {"openai", "openai-chat", "vllm", "llama.cpp"}) {
      for (const RequestParams& p : {RequestParams{}, sampling, RequestParams{false, 0.0, std::nullopt, 1}}) {
        EXPECT_EQ(request_body(backend, "org/model \"x\"", r, p), via_dom(backend, "org/model \"x\"", r, p));
      }
    }
  }
}

}  // namespace
}  // namespace servetune::loadgen
