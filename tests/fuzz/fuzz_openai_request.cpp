// libFuzzer target: the OpenAI request-body parsers (completions, chat, /tokenize, /detokenize) on arbitrary bytes.
// Any input either parses into a request within the documented limits or throws ApiError(400) whose body is valid
// JSON; another exception type (json::out_of_range, std::length_error, ...) escapes and fails the run.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace {

using servetune::server::ApiError;

template <typename Parse>
void expect_request_or_400(std::string_view body, Parse parse) {
  try {
    parse(body);
  } catch (const ApiError& e) {
    if (e.status() != 400) std::abort();
    if (!nlohmann::json::accept(e.body())) std::abort();
  }
}

void check_generate(const servetune::server::GenerateRequest& r) {
  if (r.n < 1 || r.n > 128) std::abort();
  if (r.max_tokens_given && r.sampling.max_tokens < 1) std::abort();
  if (r.kind == servetune::server::ApiKind::kChat ? r.messages.empty() : (!r.prompt_text && r.prompt_ids.empty())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace servetune::server;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  expect_request_or_400(body, [](std::string_view b) { check_generate(parse_completion_request(b)); });
  expect_request_or_400(body, [](std::string_view b) { check_generate(parse_chat_request(b)); });
  expect_request_or_400(body, [](std::string_view b) {
    const TokenizeRequest r = parse_tokenize_request(b);
    if (!r.prompt && r.messages.empty()) std::abort();
  });
  expect_request_or_400(body, [](std::string_view b) {
    for (int32_t id : parse_detokenize_request(b).tokens) {
      if (id < 0) std::abort();
    }
  });
  return 0;
}
