// One scored position's log-probabilities (the distribution a model gives the next token, teacher-forced) and the KL
// divergence between two of them. The built-in engine gives whole rows; a server gives the prompt token and its top K
// (vLLM's prompt_logprobs), so the KL of a pair with a top-K side is defined on what both sides report:
//
//   KL(base || run) over the partition {each token both report} + {the rest of the vocabulary}: each shared token is
//   its own outcome, and the rest is one outcome holding 1 - (the shared tokens' mass) on each side.
//
// That is the KL of the two distributions coarse-grained onto one partition, so it is never negative and never more
// than the whole-vocabulary KL (the data-processing inequality), and equals it when the shared tokens hold all the
// mass. The union of the two top-K sets is not used: a token only one side reports has no value on the other. With
// whole rows on both sides the KL is llama-perplexity's, over the whole vocabulary.
#pragma once

#include <cstdint>
#include <vector>

#include "servetune/sampling.h"

namespace servetune::loadgen {

struct PositionLogprobs {
  int32_t target = 0;          // the prompt's next token, the one scored
  double target_logprob = 0;   // its log-probability (exact: perplexity needs only this)
  std::vector<float> dense;    // the whole vocabulary's log-probabilities, or empty
  std::vector<TokenLogprob> sparse;  // else the tokens a server reported (the target and the top K), by token id

  bool is_dense() const { return !dense.empty(); }
  // The most likely token among those known (with whole rows or K >= 1, the model's most likely token); ties go
  // to the lowest id.
  int32_t top_token() const;
};

// KL(base || run) at one position, in nats, as defined above (>= 0).
double kl_divergence(const PositionLogprobs& base, const PositionLogprobs& run);

}  // namespace servetune::loadgen
