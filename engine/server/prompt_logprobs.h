// vLLM's `prompt_logprobs: K` on /v1/completions: for every prompt position after the first, the prompt token's
// log-probability and vocabulary rank plus the K most likely tokens there, from the engine's teacher-forced logits
// rows (Request::prompt_logits), rendered as vLLM renders them: [null, {"<id>": {"logprob", "rank", "decoded_token"}},
// ...]; the prompt token comes first in each dict, and appears once (K entries when it is among the top K, else K + 1).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace servetune {
class Tokenizer;
}

namespace servetune::server {

class PromptLogprobs {
 public:
  // `vocab` is the logits row size (the model's vocabulary, which may exceed the tokenizer's).
  PromptLogprobs(std::vector<int32_t> prompt, int32_t top_k, int64_t vocab, const Tokenizer& tokenizer);

  // The next logits rows, whole rows in prompt order (row p scores prompt token p + 1).
  void add_rows(std::span<const float> rows);
  // Every position after the first has its row, and no row came that was not whole or had no position (the
  // engine's contract; the caller answers 500 otherwise rather than render a wrong list).
  bool complete() const { return !malformed_ && rows_ + 1 >= static_cast<int64_t>(prompt_.size()); }
  // The JSON list, once complete.
  std::string json() const { return "[null" + entries_ + "]"; }

 private:
  void add_row(std::span<const float> row);
  void append_entry(int32_t token, double logprob, int64_t rank);

  std::vector<int32_t> prompt_;
  int32_t top_k_;
  int64_t vocab_;
  const Tokenizer& tokenizer_;
  int64_t rows_ = 0;
  bool malformed_ = false;
  std::string entries_;  // ",{...}" per row so far
  std::vector<double> logprobs_;
  std::vector<int32_t> order_;
};

}  // namespace servetune::server
