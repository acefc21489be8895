// One logits row's draw as a SampleRow says (Backend::sample's semantics): the arithmetic of the host Sampler
// (runtime/sampler.h), which calls these for its own draws, and of CpuBackend::sample, so both pick the same token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace servetune::cpu {

// Sum in double with eight independent partial sums (vectorisable, and the same order on every machine).
double sum_in_lanes(std::span<const float> x);
double sum_in_lanes(std::span<const double> x);

// The index at which r (drawn below the sum of w) runs out in w's running sum; rounding that leaves r >= 0 picks
// the last index with any weight.
size_t running_sum_index(std::span<const float> w, double r);
size_t running_sum_index(std::span<const double> w, double r);

// running_sum_index for weights whose block sums (blocks of kSumBlock, as exp_scaled_blocks gives them) are known:
// walks the sums, then the weights from the block where r runs out.
size_t running_sum_index(std::span<const float> w, std::span<const double> block_sums, double r);

// The candidates of filtered sampling (top-k, top-p or min-p set in `row`, temperature > 0): tokens within e^-40 of
// the best, sorted by logit (ties by id), cut by top-k, then top-p, then min-p on the tempered distribution. Top-p's
// mass is relative to the top-k candidates' total when top-k cuts, else to the whole vocabulary's as a plain
// temperature draw sums it (exp_scaled_blocks). Fills `order` (token ids; only the first returned are meaningful)
// and `p` (tempered probabilities relative to the best, unnormalised) and returns how many are kept. Only the
// tokens that can be kept are sorted. A row whose best logit is NaN or infinite keeps its first best token alone.
size_t filtered_candidates(std::span<const float> logits, const SampleRow& row, std::vector<int32_t>& order,
                           std::vector<double>& p);

// Whether no logit is NaN or +inf (-inf, a masked token, is an ordinary logit): a row that fails this came from a
// forward pass gone wrong, and any token drawn from it would be a plausible-looking lie.
bool logits_usable(std::span<const float> logits);

// Buffers of draw_row, reused across calls.
struct SampleScratch {
  std::vector<float> weights;
  std::vector<double> block_sums;
  std::vector<int32_t> order;
  std::vector<double> p;
};

// Greedy (the lowest id among tied maxima) when row.temperature is 0; otherwise the tempered distribution, filtered
// when top-k / top-p / min-p are set, from which row.uniform times the kept mass picks the token.
int32_t draw_row(std::span<const float> logits, const SampleRow& row, SampleScratch& scratch);

}  // namespace servetune::cpu
