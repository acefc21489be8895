// Mixture-of-experts routing rule, model-free: from a token's router logits, which top_k experts run and with what
// weights (softmax or sigmoid scores, optional group-limited selection, optional selection-only bias).
#pragma once

#include <cstdint>
#include <string>

namespace servetune {

enum class MoeScoring { kSoftmax, kSigmoid };

// How a group of experts is ranked when selection is group-limited (n_group > 1).
enum class MoeGroupScore {
  kMax,        // DeepSeek-V2 group_limited_greedy: the group's best selection score
  kTopTwoSum,  // DeepSeek-V3 noaux_tc: the sum of the group's two best selection scores
};

// Per token: scores = softmax(logits) over all experts, or sigmoid(logits); selection scores = scores + bias.
// With n_group > 1 the experts split into n_group contiguous groups, only the topk_group best groups stay eligible,
// and the top_k experts are picked among them; weights are the chosen experts' (unbiased) scores, divided by their
// sum when `renormalize`, then multiplied by `scaling`:
//   weight_i = score_i / (sum_j score_j + 1e-20) * scaling   (renormalize)
//   weight_i = score_i * scaling                              (otherwise)
// How each family's config maps onto this (HF config keys):
//   DeepSeek-V3 (noaux_tc):  kSigmoid, bias = e_score_correction_bias, kTopTwoSum, renormalize = norm_topk_prob,
//                            scaling = routed_scaling_factor.
//   DeepSeek-V2 (greedy: n_group = 1; group_limited_greedy: kMax), kSoftmax, no bias. V2's MoEGate renormalises only
//                            when top_k > 1 and norm_topk_prob, and multiplies by routed_scaling_factor only when it
//                            does NOT renormalise, so: renormalize = norm_topk_prob && top_k > 1,
//                            scaling = renormalize ? 1 : routed_scaling_factor.
//   Qwen2-MoE / Qwen3-MoE:   kSoftmax, n_group = 1, renormalize = norm_topk_prob, scaling = 1.
//   Mixtral:                 kSoftmax, n_group = 1, renormalize = true, scaling = 1 (the same as a softmax over the
//                            chosen logits).
// The 1e-20 is V2/V3's; for softmax scores it never changes a bit (the chosen scores sum to at least 1/n_experts), so
// Qwen's and Mixtral's plain division is matched too.
struct MoeRouting {
  int64_t n_experts = 0;
  int64_t top_k = 0;
  MoeScoring scoring = MoeScoring::kSoftmax;
  int64_t n_group = 1;     // group-limited selection when > 1 (experts [g * n_experts / n_group, ...) form group g)
  int64_t topk_group = 1;  // groups kept per token when n_group > 1
  MoeGroupScore group_score = MoeGroupScore::kMax;
  bool renormalize = false;  // norm_topk_prob: the chosen weights divided by their sum
  float scaling = 1.0f;      // applied to the final weights (see the family mapping above)
};

// Checks the routing is consistent; throws Error(kFormat) "<source>: MoE routing: ..." naming the offending field
// (and its usual config key): non-positive counts, top_k > n_experts, n_experts not divisible by n_group,
// topk_group > n_group, top_k > topk_group * experts per group, a top-two group score over one-expert groups, a
// non-positive or non-finite scaling, or more experts than int32 ids hold.
void validate_moe_routing(const MoeRouting& routing, const std::string& source);

// Routes `n` tokens. logits: [n, n_experts] (the router matmul's output, f32); bias: [n_experts] or null, added to the
// scores for selection only, never to the weights. Writes ids [n, top_k] and weights [n, top_k]: per token the
// chosen experts in descending order of selection score, ties to the lower expert id (and equal group scores to the
// lower group id). Experts of dropped groups are never chosen. Deterministic; allocates one small scratch per call,
// nothing per token. A NaN selection score ranks below every number (NaN weights still come out as NaN).
// Throws like validate_moe_routing for an inconsistent `routing`.
void route_tokens(const MoeRouting& routing, const float* logits, const float* bias, int64_t n, int32_t* ids,
                  float* weights);

}  // namespace servetune
