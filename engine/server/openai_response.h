// OpenAI response bodies and SSE stream chunks for completions and chat completions, built by hand from prefixes
// computed once per request (one chunk per token is the hot path). Output follows OpenAI's schemas: ids, object,
// created, model, choices[].text / delta / message, logprobs, finish_reason, usage. A request with n > 1 has n
// choices, indexed 0..n-1, each fed by its own engine request; usage counts the prompt once and every choice's tokens.
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
  std::string stream_start() const;  // chat: a role chunk per choice; completions: nothing
  // Text/logprobs of one choice; its final event also carries its finish_reason.
  std::string stream_event(int choice, const TokenEvent& e);
  std::string stream_usage(const Usage& total) const;  // after every choice's final event: the usage chunk, if asked for
  static std::string stream_error(const std::string& message, int status);

  // Non-streaming: add every event of every choice, then render the whole response once all have finished;
  // `prompt_logprobs` (completions, vLLM's extension: the JSON list) goes into every choice, as the prompt is theirs.
  void add(int choice, const TokenEvent& e);
  std::string response(const std::vector<FinishReason>& finish, const Usage& total,
                       const std::string* prompt_logprobs = nullptr) const;

  const std::string& id() const { return id_; }

 private:
  struct Choice {
    size_t text_offset = 0;  // streamed completions logprobs: offset of the next token's text
    std::string text;        // non-streaming accumulation
    std::vector<SampleResult> logprobs;
  };

  std::string chunk(int choice, const std::string& text, const std::vector<SampleResult>& logprobs, const char* finish,
                    const Usage* usage);
  void append_logprobs(std::string& out, const std::vector<SampleResult>& lps, size_t text_offset) const;
  void append_chat_logprob_entry(std::string& out, int32_t token, float logprob) const;
  std::string piece(int32_t token) const;
  std::string logprob_token(int32_t token) const;  // the token as logprobs name it: its text, or "token_id:N"

  ApiKind kind_;
  bool logprobs_;
  bool tokens_as_ids_;
  bool include_usage_;
  bool continuous_usage_;
  std::string id_;
  std::string prefix_;  // {"id":...,"object":...,"created":...,"model":...,"choices":
  const Tokenizer& tokenizer_;
  std::vector<Choice> choices_;
};

std::string usage_json(const Usage& u);
// The usage of a request from its choices' usages (choice 0 first): the prompt (and its cached part) counted once,
// as OpenAI and vLLM do, the completion tokens of every choice summed.
Usage combined_usage(const std::vector<Usage>& choices);
const char* finish_reason_text(FinishReason r);  // "stop", "length", "abort" (client-visible spelling)

}  // namespace servetune::server
