// Mixture-of-experts routing (see moe_routing.h): scores, group-limited top-k selection into small sorted buffers, weights.
#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace servetune {
namespace {

// DeepSeek-V2/V3 add this to the renormalising sum (a guard against dividing by zero sigmoid scores).
constexpr float kRenormalizeEpsilon = 1e-20f;

[[noreturn]] void bad_routing(const std::string& source, const std::string& what) {
  throw_format(source, "MoE routing: " + what);
}

// Higher key first, equal keys to the lower index: a strict total order (keys hold no NaN), so the selection below
// does not depend on the order candidates are offered in.
bool ranks_higher(const float* key, int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); }

// Offers `item` to best[0, filled), the up to `k` best items offered so far, kept sorted best first. k is small next
// to the candidates (top-8 of 256), so after the first few offers most are turned away by one comparison with the
// current k-th best, and the few that get in shift at most k - 1 entries.
inline void offer(int32_t item, const float* key, int32_t* best, int64_t& filled, int64_t k) {
  if (filled == k) {
    if (!ranks_higher(key, item, best[k - 1])) return;
    --filled;  // the k-th best drops out
  }
  int64_t i = filled++;
  for (; i > 0 && ranks_higher(key, item, best[i - 1]); --i) best[i] = best[i - 1];
  best[i] = item;
}

// NaN compares false both ways, which would break the ordering; rank it below every number instead.
float rankable(float x) { return std::isnan(x) ? -std::numeric_limits<float>::infinity() : x; }

void softmax(const float* logits, int64_t n, float* out) {
  float max = logits[0];
  for (int64_t e = 1; e < n; ++e) max = std::max(max, logits[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    out[e] = std::exp(logits[e] - max);
    sum += out[e];
  }
  for (int64_t e = 0; e < n; ++e) out[e] /= sum;
}

void sigmoid(const float* logits, int64_t n, float* out) {
  // exp(-x) overflowing to inf for very negative x gives 1 / inf = 0, the right limit.
  for (int64_t e = 0; e < n; ++e) out[e] = 1.0f / (1.0f + std::exp(-logits[e]));
}

// A group's rank: its best selection key, or the sum of its two best (a tie for the best counts twice).
float group_key(const float* keys, int64_t count, MoeGroupScore group_score) {
  float best = -std::numeric_limits<float>::infinity(), second = best;
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

}  // namespace

void validate_moe_routing(const MoeRouting& r, const std::string& source) {
  const auto str = [](int64_t v) { return std::to_string(v); };
  if (r.n_experts <= 0) {
    bad_routing(source, "n_experts (n_routed_experts / num_experts / num_local_experts) must be positive, got " + str(r.n_experts));
  }
  if (r.n_experts > std::numeric_limits<int32_t>::max()) {
    bad_routing(source, "n_experts " + str(r.n_experts) + " does not fit the int32 expert ids");
  }
  if (r.top_k <= 0) bad_routing(source, "top_k (num_experts_per_tok) must be positive, got " + str(r.top_k));
  if (r.top_k > r.n_experts) {
    bad_routing(source, "top_k (num_experts_per_tok) " + str(r.top_k) + " is more than n_experts " + str(r.n_experts));
  }
  if (r.n_group <= 0) bad_routing(source, "n_group must be positive, got " + str(r.n_group));
  if (r.n_experts % r.n_group != 0) {
    bad_routing(source, "n_experts " + str(r.n_experts) + " is not divisible by n_group " + str(r.n_group));
  }
  if (r.topk_group <= 0) bad_routing(source, "topk_group must be positive, got " + str(r.topk_group));
  if (r.topk_group > r.n_group) {
    bad_routing(source, "topk_group " + str(r.topk_group) + " is more than n_group " + str(r.n_group));
  }
  const int64_t per_group = r.n_experts / r.n_group;
  if (r.top_k > r.topk_group * per_group) {
    bad_routing(source, "top_k (num_experts_per_tok) " + str(r.top_k) + " is more than the " + str(r.topk_group * per_group) +
                            " experts of topk_group " + str(r.topk_group) + " groups of " + str(per_group));
  }
  if (r.n_group > 1 && r.group_score == MoeGroupScore::kTopTwoSum && per_group < 2) {
    bad_routing(source, "n_group " + str(r.n_group) + " leaves " + str(per_group) +
                            " expert per group, and the top-two group score needs at least 2");
  }
  if (!(r.scaling > 0.0f) || !std::isfinite(r.scaling)) {
    bad_routing(source, "scaling (routed_scaling_factor) must be positive and finite, got " + std::to_string(r.scaling));
  }
}

void route_tokens(const MoeRouting& r, const float* logits, const float* bias, int64_t n, int32_t* ids, float* weights) {
  validate_moe_routing(r, "route_tokens");
  if (n < 0 || (n > 0 && (logits == nullptr || ids == nullptr || weights == nullptr))) {
    throw Error(ErrorKind::kInternal, "route_tokens: " + std::to_string(n) + " tokens with a null logits, ids or weights pointer");
  }
  const int64_t n_experts = r.n_experts, per_group = n_experts / r.n_group;
  const bool grouped = r.n_group > 1;
  // One scratch for the whole call: the scores (weights come from these), the selection keys, the group keys and the
  // kept groups. Each token's chosen experts are selected straight into its row of `ids`.
  std::vector<float> scores(static_cast<size_t>(n_experts)), keys(static_cast<size_t>(n_experts));
  std::vector<float> group_keys(static_cast<size_t>(r.n_group));
  std::vector<int32_t> kept_groups(static_cast<size_t>(r.topk_group));

  for (int64_t t = 0; t < n; ++t) {
    const float* token_logits = logits + t * n_experts;
    if (r.scoring == MoeScoring::kSoftmax) {
      softmax(token_logits, n_experts, scores.data());
    } else {
      sigmoid(token_logits, n_experts, scores.data());
    }
    for (int64_t e = 0; e < n_experts; ++e) keys[e] = rankable(bias ? scores[e] + bias[e] : scores[e]);

    int32_t* token_ids = ids + t * r.top_k;
    int64_t chosen = 0;
    if (grouped) {
      int64_t kept = 0;
      for (int64_t g = 0; g < r.n_group; ++g) {
        group_keys[g] = group_key(keys.data() + g * per_group, per_group, r.group_score);
        offer(static_cast<int32_t>(g), group_keys.data(), kept_groups.data(), kept, r.topk_group);
      }
      // Only the kept groups' experts are offered, so a dropped group's expert is never chosen, as in DeepSeek's
      // reference (a -inf mask). HF transformers masks with 0.0 instead, which differs only when fewer than top_k kept
      // experts have a selection score above 0 (possible with sigmoid scores and a negative bias).
      for (int64_t i = 0; i < r.topk_group; ++i) {
        const int64_t first = kept_groups[i] * per_group;
        for (int64_t e = first; e < first + per_group; ++e) offer(static_cast<int32_t>(e), keys.data(), token_ids, chosen, r.top_k);
      }
    } else {
      for (int64_t e = 0; e < n_experts; ++e) offer(static_cast<int32_t>(e), keys.data(), token_ids, chosen, r.top_k);
    }

    float* token_weights = weights + t * r.top_k;
    float sum = 0.0f;
    for (int64_t k = 0; k < r.top_k; ++k) {
      token_weights[k] = scores[token_ids[k]];
      sum += token_weights[k];
    }
    const float denominator = sum + kRenormalizeEpsilon;
    for (int64_t k = 0; k < r.top_k; ++k) {
      if (r.renormalize) token_weights[k] /= denominator;
      token_weights[k] *= r.scaling;
    }
  }
}

}  // namespace servetune
