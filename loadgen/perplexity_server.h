// The perplexity measurement against an OpenAI-compatible server: each chunk is one /v1/completions request with
// the chunk's token ids as the prompt, max_tokens 1 and vLLM's `prompt_logprobs: K`; the response's per-position
// dicts give the prompt token's log-probability (exact, so perplexity equals the engine path's) and the top K (so
// KL is the top-K form of position_logprobs.h). vLLM and `servetune serve` answer it; a server that ignores the
// field (no prompt_logprobs in its response) or refuses it is an error naming the URL and the field.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loadgen/perplexity.h"

namespace servetune::loadgen {

struct ServerEndpoint {
  std::string url;      // the server's base URL (http://host:port), its /v1, or the whole /v1/completions URL
  std::string model;    // the "model" field; "" leaves it out (the server's default model)
  std::string api_key;  // sent as "Authorization: Bearer KEY" when set
  int top_logprobs = 20;         // K, the prompt_logprobs asked for (vLLM's default --max-logprobs is 20)
  double request_timeout_s = 600;
};

// The /v1/completions URL of `url` (see ServerEndpoint::url).
std::string completions_url(const std::string& url);

// The scored positions (first .. chunk.size() - 2, each scoring the next prompt token) of one /v1/completions
// response body for `chunk`. Throws Error(kUnsupported) naming `url` when the response has no prompt_logprobs, and
// Error(kFormat) naming it when they do not fit the chunk.
std::vector<PositionLogprobs> parse_prompt_logprobs(const std::string& body, const std::vector<int32_t>& chunk, int first,
                                                    const std::string& url);

// A ChunkScorer over `server` (top-K rows; `vocab` is the client tokenizer's, recorded in a saved file). Throws
// Error(kUsage) for a K below 1 (top-1 agreement and KL need the most likely token).
std::unique_ptr<ChunkScorer> make_server_scorer(const ServerEndpoint& server, int32_t vocab);

}  // namespace servetune::loadgen
