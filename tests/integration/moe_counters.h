// The mixture-of-experts counters an engine reports, checked against what its batches must have routed.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "model/checkpoint.h"
#include "servetune/engine.h"

namespace servetune::testing {

// Each token the engine ran was routed to top_k experts in every MoE layer, counted once whatever the ranks.
inline void expect_counted_once(const EngineStats& s, const std::string& model, const std::string& name) {
  const Checkpoint ck(model, LoadFormat::kAuto);
  const MoeConfig& moe = ck.config().moe;
  const auto moe_layers = std::count(moe.moe_layer.begin(), moe.moe_layer.end(), true);
  EXPECT_EQ(s.moe_experts, moe.routing.n_experts) << name;
  EXPECT_GT(s.batched_tokens, 0) << name;
  EXPECT_EQ(s.moe_routed_tokens, s.batched_tokens * moe.routing.top_k * moe_layers) << name;
  EXPECT_GE(s.moe_busiest_expert_tokens * moe.routing.n_experts, s.moe_routed_tokens) << name;
  EXPECT_LE(s.moe_busiest_expert_tokens, s.batched_tokens * moe_layers) << name;
  // The busiest expert-parallel group has at least its share of the assignments and at most all of them.
  EXPECT_GE(s.moe_ep_groups, 1) << name;
  EXPECT_GE(s.moe_busiest_ep_group_tokens * s.moe_ep_groups, s.moe_routed_tokens) << name;
  EXPECT_LE(s.moe_busiest_ep_group_tokens, s.moe_routed_tokens) << name;
  if (s.moe_ep_groups == 1) {
    EXPECT_EQ(s.moe_busiest_ep_group_tokens, s.moe_routed_tokens) << name;
  }
}

}  // namespace servetune::testing
