// Parsing and validation of request bodies for /v1/completions, /v1/chat/completions, /tokenize and /detokenize:
// wrong types, bad ranges and options this server cannot honour become ApiError(400) naming the field; fields
// that do not change the output (user, metadata, ...) and fields unknown to OpenAI and vLLM are ignored, as vLLM does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "servetune/sampling.h"
#include "servetune/tokenizer.h"

namespace servetune::server {

enum class ApiKind { kCompletion, kChat };

struct GenerateRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // "" when the client did not name one
  // Completions: exactly one of prompt_text / prompt_ids is set.
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  // Chat.
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;
  bool add_special_tokens = true;  // completions: BOS as the model wants; chat: false (the template spells it)
  SamplingParams sampling;         // sampling.max_tokens is meaningful only when max_tokens_given
  bool max_tokens_given = false;
  int32_t n = 1;                   // choices: independent samples of the same prompt (best_of must equal n)
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (vLLM): usage on every chunk
  bool logprobs = false;          // chat: logprobs=true; completions: logprobs=N given
  int32_t prompt_logprobs = -1;   // completions, vLLM's extension: K >= 0 returns the prompt's log-probabilities
  bool tokens_as_ids = false;     // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N"
};

// Throw ApiError(400) for malformed JSON or invalid fields.
GenerateRequest parse_completion_request(std::string_view body);
GenerateRequest parse_chat_request(std::string_view body);

struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;  // completion form; otherwise messages (chat form)
  std::vector<ChatMessage> messages;
  bool add_special_tokens = true;     // vLLM: true for prompt, false for messages
  bool add_generation_prompt = true;
  bool return_token_strs = false;
};
TokenizeRequest parse_tokenize_request(std::string_view body);

struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize_request(std::string_view body);

// Constant-time check of an "Authorization: Bearer KEY" header value against `key` (time depends only on key size).
bool bearer_matches(std::string_view header_value, std::string_view key);

}  // namespace servetune::server
