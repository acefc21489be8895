// Prompt log-probabilities in vLLM's shape (see prompt_logprobs.h). Ranks count the tokens at least as likely as the
// token, itself included, as vLLM's batched_count_greater_than does (so the most likely token has rank 1).
#include "server/prompt_logprobs.h"

#include <algorithm>

#include "server/json_text.h"
#include "servetune/sampling.h"
#include "servetune/tokenizer.h"

namespace servetune::server {

PromptLogprobs::PromptLogprobs(std::vector<int32_t> prompt, int32_t top_k, int64_t vocab, const Tokenizer& tokenizer)
    : prompt_(std::move(prompt)), top_k_(std::max<int32_t>(0, top_k)), vocab_(vocab), tokenizer_(tokenizer) {}

void PromptLogprobs::add_rows(std::span<const float> rows) {
  const auto v = static_cast<size_t>(vocab_);
  if (v == 0 || rows.size() % v != 0) malformed_ = true;
  for (size_t off = 0; !malformed_ && off + v <= rows.size(); off += v) add_row(rows.subspan(off, v));
}

void PromptLogprobs::add_row(std::span<const float> row) {
  if (rows_ + 1 >= static_cast<int64_t>(prompt_.size())) {
    malformed_ = true;
    return;
  }
  const int32_t token = prompt_[static_cast<size_t>(rows_) + 1];
  ++rows_;
  log_softmax(row, logprobs_);
  const double lp = logprobs_[static_cast<size_t>(token)];
  const auto rank = std::count_if(logprobs_.begin(), logprobs_.end(), [lp](double x) { return x >= lp; });
  entries_ += ",{";
  append_entry(token, lp, rank);
  const auto k = std::min<size_t>(static_cast<size_t>(top_k_), logprobs_.size());
  if (k == 0) {
    entries_ += '}';
    return;
  }
  // Most likely first; ties by token id, so the order (and each rank below) is deterministic.
  order_.resize(logprobs_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
  const auto more_likely = [this](int32_t a, int32_t b) {
    const double la = logprobs_[static_cast<size_t>(a)], lb = logprobs_[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(k), order_.end(), more_likely);
  for (size_t i = 0; i < k; ++i) {
    const int32_t t = order_[i];
    if (t == token) continue;
    entries_ += ',';
    append_entry(t, logprobs_[static_cast<size_t>(t)], static_cast<int64_t>(i) + 1);
  }
  entries_ += '}';
}

void PromptLogprobs::append_entry(int32_t token, double logprob, int64_t rank) {
  entries_ += '"' + std::to_string(token) + "\":{\"logprob\":";
  append_json_number(entries_, logprob);
  entries_ += ",\"rank\":" + std::to_string(rank) + ",\"decoded_token\":";
  append_json_string(entries_, token < tokenizer_.vocab_size() ? tokenizer_.token_to_piece(token) : std::string());
  entries_ += '}';
}

}  // namespace servetune::server
