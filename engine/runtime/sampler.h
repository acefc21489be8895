// Turns one request's logits into its next token: penalties, temperature, top-k, top-p, min-p, then greedy or a
// seeded draw; optionally the log-probabilities of the raw distribution (as vLLM reports them).
// Holds the per-request state (RNG, output token counts), so a request's samples depend only on its own seed.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/sample_row.h"
#include "servetune/sampling.h"

namespace servetune {

// The candidates of filtered sampling (top-k, top-p or min-p set): tokens within e^-40 of the best, sorted by logit
// (ties by id), cut by top-k, then top-p, then min-p on the tempered distribution. Fills `order` (token ids) and `p`
// (tempered probabilities relative to the best, unnormalised) and returns how many of them are kept.
size_t filtered_candidates(std::span<const float> logits, const SamplingParams& params, std::vector<int32_t>& order,
                           std::vector<double>& p);

class Sampler {
 public:
  // `default_seed` is used when params.seed is unset; `prompt` feeds the repetition penalty.
  Sampler(const SamplingParams& params, uint64_t default_seed, std::span<const int32_t> prompt);

  // Samples from `logits` (modified in place). Tokens in `banned` are never chosen (EOS before min_tokens).
  // With a speculative `draft` token (>= 0) the draw is the lossless verification of that draft: greedy picks the
  // argmax as always. Sampling with a deterministic draft (empty `draft_probs`) returns `draft` with probability
  // p(draft) under the processed distribution p, otherwise a draw from p with `draft` removed and renormalised.
  // With `draft_probs` = q [vocab], the distribution the draft was drawn from, it returns `draft` with probability
  // min(1, p(draft) / q(draft)), otherwise a draw from max(0, p - q) renormalised. Either way: overall exactly p.
  SampleResult sample(std::span<float> logits, std::span<const int32_t> banned = {}, int32_t draft = -1,
                      std::span<const float> draft_probs = {});
  // The lossless verification of a draft tree node's children `siblings` (deterministic drafts, distinct tokens):
  // greedy picks the argmax; sampling tries them in order, sibling i accepted with its probability under p with the
  // siblings before it removed and renormalised, otherwise a draw from p without any of them (SpecInfer / EAGLE's
  // recursive rejection sampling with one-hot draft distributions). Overall exactly p.
  SampleResult sample_siblings(std::span<float> logits, std::span<const int32_t> banned, std::span<const int32_t> siblings);
  // Why this request's next token cannot be drawn by Backend::sample (penalties, logprobs, banned tokens; a
  // speculative draft is the caller's to exclude), or nullptr when it can.
  const char* device_refusal(std::span<const int32_t> banned) const;
  // The next draw as a device SampleRow: the settings, and the uniform that sample() would draw from this request's
  // RNG (greedy draws none), so the device and the host pick the same token for the same seed.
  SampleRow device_row();
  // Records a token as generated (for penalties). sample() does not call it: speculative paths may reject tokens.
  void accept(int32_t token);

  // Test-only: a deliberately wrong verification rule (after a rejection the draw is from p, not from p minus the
  // draft distribution), so the statistical test of the sampled distribution can show that it catches a broken rule.
  void break_verification_for_test() { broken_verification_ = true; }

 private:
  void apply_penalties(std::span<float> logits) const;
  std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t n, float lse);
  // Penalties, logprobs and banned tokens applied to `logits`; then `choose` picks the token.
  template <class Choose>
  SampleResult sample_with(std::span<float> logits, std::span<const int32_t> banned, Choose&& choose);
  // Deterministic drafts `drafts` (tried in order) or one draft drawn from `draft_probs`.
  int32_t draw(std::span<const float> logits, std::span<const int32_t> drafts, std::span<const float> draft_probs);
  // Draws among scratch_.p[0, n) (scratch_.order maps index to token), verifying `drafts` at indices `draft_index` (n
  // when a draft is not among them): deterministic ones in order, or one drawn from `draft_probs`.
  int32_t pick(size_t n, std::span<const int32_t> drafts, std::span<const size_t> draft_index, std::span<const float> draft_probs);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::unordered_set<int32_t> seen_;  // prompt + output, only for the repetition penalty
  cpu::SampleScratch scratch_;        // draw_row's buffers, also pick()'s candidates (order) and their weights (p)
  std::vector<float> raw_;            // raw logits, kept only when logprobs are requested
  bool broken_verification_ = false;
};

}  // namespace servetune
