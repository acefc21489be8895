// One token's mixture-of-experts routing (the rule moe_routing.h states), as inline functions both the host's
// route_tokens and the GPU's routing kernel (cuda/moe_routing.cu) call, so the two pick experts by the same code.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/moe_routing.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SERVETUNE_ROUTE_HD __host__ __device__
#else
#define SERVETUNE_ROUTE_HD
#endif

namespace servetune::moe_route {

// DeepSeek-V2/V3 add this to the renormalising sum (a guard against dividing by zero sigmoid scores).
constexpr float kRenormalizeEpsilon = 1e-20f;

// Higher key first, equal keys to the lower index: a strict total order (keys hold no NaN), so the selection below
// does not depend on the order candidates are offered in.
SERVETUNE_ROUTE_HD inline bool ranks_higher(const float* key, int32_t a, int32_t b) {
  return key[a] > key[b] || (key[a] == key[b] && a < b);
}

// Offers `item` to best[0, filled), the up to `k` best items offered so far, kept sorted best first. k is small next
// to the candidates (top-8 of 256), so after the first few offers most are turned away by one comparison with the
// current k-th best, and the few that get in shift at most k - 1 entries.
SERVETUNE_ROUTE_HD inline void offer(int32_t item, const float* key, int32_t* best, int64_t& filled, int64_t k) {
  if (filled == k) {
    if (!ranks_higher(key, item, best[k - 1])) return;
    --filled;  // the k-th best drops out
  }
  int64_t i = filled++;
  for (; i > 0 && ranks_higher(key, item, best[i - 1]); --i) best[i] = best[i - 1];
  best[i] = item;
}

// NaN compares false both ways, which would break the ordering; rank it below every number instead.
SERVETUNE_ROUTE_HD inline float rankable(float x) { return x != x ? -__builtin_huge_valf() : x; }

SERVETUNE_ROUTE_HD inline void softmax(const float* logits, int64_t n, float* out) {
  float max = logits[0];
  for (int64_t e = 1; e < n; ++e) max = logits[e] > max ? logits[e] : max;
  float sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    out[e] = expf(logits[e] - max);
    sum += out[e];
  }
  for (int64_t e = 0; e < n; ++e) out[e] /= sum;
}

SERVETUNE_ROUTE_HD inline void sigmoid(const float* logits, int64_t n, float* out) {
  // exp(-x) overflowing to inf for very negative x gives 1 / inf = 0, the right limit.
  for (int64_t e = 0; e < n; ++e) out[e] = 1.0f / (1.0f + expf(-logits[e]));
}

// A group's rank: its best selection key, or the sum of its two best (a tie for the best counts twice).
SERVETUNE_ROUTE_HD inline float group_key(const float* keys, int64_t count, MoeGroupScore group_score) {
  float best = -__builtin_huge_valf(), second = best;
  for (int64_t i = 0; i < count; ++i) {
    if (keys[i] > best) {
      second = best;
      best = keys[i];
    } else if (keys[i] > second) {
      second = keys[i];
    }
  }
  return group_score == MoeGroupScore::kMax ? best : best + second;
}

// Routes one token: `logits` its n_experts router logits, `bias` the selection bias or null; writes its top_k expert
// ids (best first) and weights. Scratch: scores and keys of n_experts floats, group_keys of n_group, kept_groups of
// topk_group. `r` is valid (validate_moe_routing).
SERVETUNE_ROUTE_HD inline void route_token(const MoeRouting& r, const float* logits, const float* bias, int32_t* ids,
                                           float* weights, float* scores, float* keys, float* group_keys,
                                           int32_t* kept_groups) {
  const int64_t n_experts = r.n_experts, per_group = n_experts / r.n_group;
  if (r.scoring == MoeScoring::kSoftmax) {
    softmax(logits, n_experts, scores);
  } else {
    sigmoid(logits, n_experts, scores);
  }
  for (int64_t e = 0; e < n_experts; ++e) keys[e] = rankable(bias != nullptr ? scores[e] + bias[e] : scores[e]);

  int64_t chosen = 0;
  if (r.n_group > 1) {
    int64_t kept = 0;
    for (int64_t g = 0; g < r.n_group; ++g) {
      group_keys[g] = group_key(keys + g * per_group, per_group, r.group_score);
      offer(static_cast<int32_t>(g), group_keys, kept_groups, kept, r.topk_group);
    }
    // Only the kept groups' experts are offered, so a dropped group's expert is never chosen, as in DeepSeek's
    // reference (a -inf mask). HF transformers masks with 0.0 instead, which differs only when fewer than top_k kept
    // experts have a selection score above 0 (possible with sigmoid scores and a negative bias).
    for (int64_t i = 0; i < r.topk_group; ++i) {
      const int64_t first = kept_groups[i] * per_group;
      for (int64_t e = first; e < first + per_group; ++e) offer(static_cast<int32_t>(e), keys, ids, chosen, r.top_k);
    }
  } else {
    for (int64_t e = 0; e < n_experts; ++e) offer(static_cast<int32_t>(e), keys, ids, chosen, r.top_k);
  }

  float sum = 0.0f;
  for (int64_t k = 0; k < r.top_k; ++k) {
    weights[k] = scores[ids[k]];
    sum += weights[k];
  }
  const float denominator = sum + kRenormalizeEpsilon;
  for (int64_t k = 0; k < r.top_k; ++k) {
    if (r.renormalize) weights[k] /= denominator;
    weights[k] *= r.scaling;
  }
}

}  // namespace servetune::moe_route
