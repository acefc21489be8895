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
  int64_t cached_tokens = -1;      // usage.prompt_tokens_details.cached_tokens
  std::string error;  // non-empty: malformed payload or an "error" object from the server
  bool server_error = false;  // the error is the server's own "error" object (else the payload is malformed)
};

// Parses `data` into `out` (which is reset first).
void parse_stream_chunk(std::string_view data, ApiKind kind, StreamChunk& out);

// parse_stream_chunk for the payloads of one stream, which servers send with the same bytes around a changing
// text: a payload that matches the last fully scanned one outside its text string is checked by scanning only
// that string. Same results as parse_stream_chunk on any input.
class StreamChunkParser {
 public:
  void parse(std::string_view data, ApiKind kind, StreamChunk& out);
  int64_t fast_path_hits() const { return fast_path_hits_; }  // payloads that took the text-only scan

 private:
  int64_t fast_path_hits_ = 0;
  std::string last_;  // the last fully scanned payload with one text string, empty when there is none
  ApiKind last_kind_ = ApiKind::kCompletions;
  size_t text_begin_ = 0;  // its text string's content: [text_begin_, text_end_) of last_
  size_t text_end_ = 0;
  StreamChunk last_fields_;  // what it held besides the text
};

}  // namespace servetune::loadgen
