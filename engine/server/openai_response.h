// OpenAI response bodies and SSE stream chunks for completions and chat completions, built by hand from prefixes
// computed once per request (one chunk per token is the hot path). Output follows OpenAI's schemas: ids, object,
// created, model, choices[].text / delta / message, logprobs, finish_reason, usage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "servetune/request.h"
#include "server/openai_request.h"

namespace servetune {
class Tokenizer;
}

namespace servetune::server {

inline constexpr const char* kSseDone = "data: [DONE]\n\n";

class ResponseBuilder {
 public:
  ResponseBuilder(const GenerateRequest& request, std::string id, int64_t created, const std::string& model,
                  const Tokenizer& tokenizer);

  // Streaming: each returns zero or more complete SSE events ("data: {...}\n\n").
  std::string stream_start() const;                 // chat: the role chunk; completions: nothing
  std::string stream_event(const TokenEvent& e);    // text/logprobs; on the final event also finish_reason (+usage)
  static std::string stream_error(const std::string& message, int status);

  // Non-streaming: add every event, then render the whole response on the final one.
  void add(const TokenEvent& e);
  std::string response(const TokenEvent& final_event) const;

  const std::string& id() const { return id_; }

 private:
  std::string chunk(const std::string& text, const std::vector<SampleResult>& logprobs, const char* finish,
                    const Usage* usage);
  void append_logprobs(std::string& out, const std::vector<SampleResult>& lps, size_t text_offset) const;
  void append_chat_logprob_entry(std::string& out, int32_t token, float logprob) const;
  std::string piece(int32_t token) const;

  ApiKind kind_;
  bool logprobs_;
  bool include_usage_;
  bool continuous_usage_;
  std::string id_;
  std::string prefix_;  // {"id":...,"object":...,"created":...,"model":...,"choices":
  const Tokenizer& tokenizer_;
  size_t text_offset_ = 0;  // completions logprobs: offset of the next token's text

  // Non-streaming accumulation.
  std::string text_;
  std::vector<SampleResult> all_logprobs_;
};

std::string usage_json(const Usage& u);
const char* finish_reason_text(FinishReason r);  // "stop", "length", "abort" (client-visible spelling)

}  // namespace servetune::server
