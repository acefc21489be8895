// Per-request sampling settings (OpenAI / vLLM semantics), their validation, and what one draw returns (the token and,
// when asked for, its log-probability and the top alternatives). Public API: plain data, no engine internals.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace servetune {

struct SamplingParams {
  float temperature = 1.0f;  // 0 means greedy
  int32_t top_k = 0;         // <= 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float presence_penalty = 0.0f;    // OpenAI: subtract once per token already generated
  float frequency_penalty = 0.0f;   // OpenAI: subtract per occurrence in the output
  float repetition_penalty = 1.0f;  // HF/llama.cpp: divide positive / multiply negative logits of seen tokens
  std::optional<uint64_t> seed;     // same seed, same output
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;  // EOS and stop tokens are ignored until this many tokens are out
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings; the matched text is not returned
  bool ignore_eos = false;
  int32_t logprobs = -1;  // -1: none; n >= 0: the sampled token's logprob plus the top-n alternatives

  bool greedy() const { return temperature <= 0.0f; }
};

// Throws Error(kInvalidRequest) naming the first bad field.
void validate_sampling_params(const SamplingParams& p);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;             // of the sampled token under the raw distribution (when logprobs >= 0)
  std::vector<TokenLogprob> top;    // top-n of the raw distribution, best first
};

// The log-softmax of one raw logits row, in double: the teacher-forced scores of `servetune perplexity` and of the
// server's prompt_logprobs, one function so the two paths give the same numbers.
void log_softmax(std::span<const float> logits, std::vector<double>& out);

}  // namespace servetune
