// Speculative decoding: a Speculator proposes draft tokens for a running request; verify_draft() checks them
// against the target's logits at the 1 + k verified positions (one forward), losslessly.
// Invariant: verification emits exactly what plain decoding would in distribution (greedy: token for token).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/sampler.h"

namespace servetune {

struct EngineConfig;

class Speculator {
 public:
  virtual ~Speculator() = default;
  // Writes up to `max_tokens` draft tokens continuing `context` into `out` (cleared first; may stay empty).
  virtual void propose(std::span<const int32_t> context, int64_t max_tokens, std::vector<int32_t>& out) const = 0;
  virtual const char* name() const = 0;
};

// Prompt lookup over the request's own tokens: the longest suffix n-gram (max_n down to min_n) that occurred
// earlier proposes the tokens that followed its most recent earlier occurrence.
class NgramSpeculator final : public Speculator {
 public:
  NgramSpeculator(int64_t min_n, int64_t max_n);
  void propose(std::span<const int32_t> context, int64_t max_tokens, std::vector<int32_t>& out) const override;
  const char* name() const override { return "ngram"; }

 private:
  int64_t min_n_, max_n_;
};

// The speculator a (validated) config asks for; nullptr without speculation. Throws Error(kUnsupported) for
// algorithms that are not implemented yet (draft, eagle, mtp).
std::unique_ptr<Speculator> make_speculator(const EngineConfig& config);
// Draft tokens per step the config asks for (speculative_num_draft_tokens, default 4 with ngram).
int64_t speculative_draft_tokens(const EngineConfig& config);

// Verifies `draft` (k tokens) against logits rows 0..k (row j: the target's logits after the context plus
// draft[0..j)). Per row: banned() gives the tokens the sampler must not pick, the sampler draws with the draft
// token as candidate (greedy: argmax; sampling: accept with p_target(d), else draw from p_target without d), the
// sampler records the token (penalties), and emit(result) streams it and returns true when the request is finished.
// With an empty draft this is one plain sampling step. Stops at the first rejection
// (whose replacement token is emitted), at a finish, or after the bonus token of row k.
// Returns the number of draft tokens accepted and emitted (their K/V stays valid).
int64_t verify_draft(Sampler& sampler, std::span<const int32_t> draft, const std::function<std::span<float>(size_t)>& row,
                     const std::function<std::vector<int32_t>()>& banned, const std::function<bool(SampleResult&)>& emit);

}  // namespace servetune
