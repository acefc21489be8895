// What a caller submits to the engine and what comes back: a Request, and a stream of TokenEvents with
// monotonic engine-side timestamps.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "servetune/sampling.h"

namespace servetune {

struct Request {
  // Exactly one of prompt (text, tokenized with BOS as the model wants) or prompt_ids.
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  bool add_special_tokens = true;  // BOS for text prompts
  bool parse_special = true;       // text like "<|im_start|>" becomes the special token (chat templates rely on it)
  SamplingParams sampling;
  bool detokenize = true;          // produce text deltas
  // Teacher forcing: the logits of every prompt position but the last (row p predicts prompt token p + 1) come back
  // in TokenEvent::prompt_logits, in order, as the prompt is computed; the prompt is computed in full (no prefix-cache
  // reuse). For perplexity and KL measurements (servetune perplexity).
  bool prompt_logits = false;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error", or "" for kNone

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  // Speculative decoding of this request: verifications with drafts, draft tokens, accepted draft tokens.
  int64_t spec_num_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  double spec_acceptance_rate() const {
    return spec_draft_tokens > 0 ? static_cast<double>(spec_accepted_tokens) / static_cast<double>(spec_draft_tokens) : 0.0;
  }
  double spec_mean_accepted_length() const {
    return spec_num_drafts > 0 ? 1.0 + static_cast<double>(spec_accepted_tokens) / static_cast<double>(spec_num_drafts) : 0.0;
  }
};

using EngineClock = std::chrono::steady_clock;

struct TokenEvent {
  uint64_t request_id = 0;
  std::vector<int32_t> token_ids;           // new tokens (several when speculation accepts a burst)
  std::string text;                         // new text (never a partial UTF-8 sequence)
  std::vector<SampleResult> logprobs;       // per new token, when requested
  EngineClock::time_point time;             // when the engine produced the event
  FinishReason finish = FinishReason::kNone;  // set on the last event
  std::string error;                        // with kError
  Usage usage;                              // running totals
  bool first_token = false;                 // this event carries the request's first output token
  // With Request::prompt_logits: the next prompt positions' raw logits rows (vocabulary-sized, in order); an event
  // may carry only these (no tokens) while the prompt is computed in chunks.
  std::vector<float> prompt_logits;
};

}  // namespace servetune
