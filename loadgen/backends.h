// HTTP backends of `servetune bench` and the request each one sends, as vLLM's benchmark request functions do:
// openai / vllm / sglang / llama.cpp stream /v1/completions, openai-chat streams /v1/chat/completions.
#pragma once

#include <string>
#include <vector>

#include "datasets/dataset.h"
#include "loadgen/client.h"
#include "loadgen/stream_chunk.h"

namespace servetune::loadgen {

const std::vector<std::string>& http_backends();  // openai, openai-chat, vllm, sglang, llama.cpp
bool is_http_backend(const std::string& backend);
ApiKind backend_api(const std::string& backend);
std::string default_endpoint(const std::string& backend);
// Throws Error(kUsage) when the URL does not end the way the backend's API does (as vLLM's _validate_api_url).
void validate_endpoint(const std::string& backend, const std::string& api_url);

// The JSON body of one streaming request: model, prompt (for chat: one user message, or a multi-turn turn's
// messages; completions send a turn's chat-templated prompt text), max_tokens
// (max_completion_tokens for chat), stream with stream_options.include_usage, ignore_eos when asked (all of
// these servers accept it), and the sampling fields that are set.
std::string request_body(const std::string& backend, const std::string& model, const datasets::SampleRequest& r,
                         const RequestParams& params);

}  // namespace servetune::loadgen
