// One data payload of an OpenAI-compatible streaming response (completions or chat completions): whether it is
// a content chunk (non-empty "choices", vLLM's rule), its text, usage, and server-reported errors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace servetune::loadgen {

enum class ApiKind { kCompletions, kChat };

struct StreamChunk {
  bool done = false;         // the "[DONE]" sentinel
  bool has_choices = false;  // a content chunk: counts for TTFT / ITL even when its text is empty
  std::string text;          // choices[0].text (completions) or choices[0].delta.content (chat)
  bool has_usage = false;
  int64_t prompt_tokens = -1;      // -1: not reported
  int64_t completion_tokens = -1;
  std::string error;  // non-empty: malformed payload or an "error" object from the server
};

// Parses `data` into `out` (which is reset first).
void parse_stream_chunk(std::string_view data, ApiKind kind, StreamChunk& out);

}  // namespace servetune::loadgen
