// Mixture-of-experts routing (see moe_routing.h): validation, and each token routed by moe_route_token.h.
#include "backend/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/moe_route_token.h"
#include "core/error.h"

namespace servetune {
namespace {

[[noreturn]] void bad_routing(const std::string& source, const std::string& what) {
  throw_format(source, "MoE routing: " + what);
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
  // One scratch for the whole call: the scores (weights come from these), the selection keys, the group keys and the
  // kept groups. Each token's chosen experts are selected straight into its row of `ids`.
  const auto n_experts = static_cast<size_t>(r.n_experts);
  std::vector<float> scores(n_experts), keys(n_experts), group_keys(static_cast<size_t>(r.n_group));
  std::vector<int32_t> kept_groups(static_cast<size_t>(r.topk_group));
  for (int64_t t = 0; t < n; ++t) {
    moe_route::route_token(r, logits + t * r.n_experts, bias, ids + t * r.top_k, weights + t * r.top_k, scores.data(),
                           keys.data(), group_keys.data(), kept_groups.data());
  }
}

}  // namespace servetune
