// The communication cost model's arithmetic on a hand-computed case (4 ranks, 4 layers of hidden 1024, one dense,
// 8 experts top-2, vocab 32000, 64 tokens): calls, payload and sent bytes per scheme, the alpha-beta time on a
// 100 GB/s, 2 us link, the dry-run line, the interconnect table and the sweep file's `interconnects` key.
#include <gtest/gtest.h>

#include "servetune/error.h"
#include "tuner/comm_cost.h"
#include "tuner/spec_file.h"
#include "tuner/sweep_spec.h"

namespace servetune::tuner {
namespace {

ModelInfo moe_model() {
  ModelInfo m;
  m.n_layers = 4;
  m.hidden = 1024;
  m.vocab = 32000;
  m.experts = 8;
  m.experts_per_token = 2;
  m.dense_layers = 1;
  return m;
}

void expect_kind(const CollectiveStats& s, CollectiveKind k, int64_t calls, int64_t bytes) {
  EXPECT_EQ(totals_of(s, k).calls, calls) << collective_kind_name(k);
  EXPECT_EQ(totals_of(s, k).bytes, bytes) << collective_kind_name(k);
}

const Interconnect kCommLink{"test", 100.0, 2.0};  // 1e11 bytes/s, 2e-6 s per hop

TEST(CommCost, TensorParallelByHand) {
  // Per layer 2 all-reduces of 64 x 1024 x 4 = 262144 bytes; a ring of 4 sends 2 x 3/4 of that (393216) in 6 hops.
  // The logits gather: 64 x 32000 x 4 = 8192000 bytes, 3/4 sent (6144000) in 3 hops.
  const auto cs = step_collectives(CommScheme::kTensorParallel, moe_model(), 4, 4, {64, 64});
  const CollectiveStats s = predicted_stats(cs);
  expect_kind(s, CollectiveKind::kAllReduce, 8, 8 * 262144);
  expect_kind(s, CollectiveKind::kAllGather, 1, 8192000);
  for (CollectiveKind k : {CollectiveKind::kReduceScatter, CollectiveKind::kAllToAll, CollectiveKind::kBroadcast, CollectiveKind::kBarrier}) {
    expect_kind(s, k, 0, 0);
  }
  EXPECT_DOUBLE_EQ(sent_bytes_per_step(cs), 8 * 393216.0 + 6144000.0);
  // 8 x (6 x 2 us + 393216 / 1e11 s) + (3 x 2 us + 6144000 / 1e11 s) = 127.45728 us + 67.44 us.
  EXPECT_NEAR(predicted_seconds(cs, kCommLink), 194.89728e-6, 1e-12);
}

TEST(CommCost, ExpertAllToAllByHand) {
  // Attention (4) and the dense layer's MLP (1) stay all-reduces; the 3 MoE layers dispatch and combine. Each rank
  // sends its 16 tokens (x 1024 x 4 = 65536 bytes) once to each rank owning one of the token's 2 experts: a rank owns
  // 2 of the 8 experts, and misses both of a token's with probability (6/8)(5/7) = 15/28, so 4 x 13/28 copies in all
  // (121709.7 bytes), 3 x 13/28 of them (91282.3 bytes) to other ranks.
  const auto cs = step_collectives(CommScheme::kExpertAllToAll, moe_model(), 4, 4, {64, 64});
  const CollectiveStats s = predicted_stats(cs);
  expect_kind(s, CollectiveKind::kAllReduce, 5, 5 * 262144);
  expect_kind(s, CollectiveKind::kAllToAll, 6, 6 * 121710);
  expect_kind(s, CollectiveKind::kAllGather, 1, 8192000);
  EXPECT_NEAR(sent_bytes_per_step(cs), 5 * 393216.0 + 6 * 65536.0 * 39 / 28 + 6144000.0, 1e-6);
  // Top-8 of 256 experts on 2 ranks: a token reaches nearly both ranks (1 - C(128, 8) / C(256, 8) = 0.99651 each),
  // 2 copies rather than 8.
  ModelInfo deepseek = moe_model();
  deepseek.experts = 256;
  deepseek.experts_per_token = 8;
  const auto ds = predicted_stats(step_collectives(CommScheme::kExpertAllToAll, deepseek, 2, 2, {64, 0}));
  EXPECT_NEAR(static_cast<double>(totals_of(ds, CollectiveKind::kAllToAll).bytes) / 6 / (32 * 4096), 2 * 0.99651, 1e-5);
}

TEST(CommCost, DpAttentionGathersAndScattersEachMoeLayer) {
  // Per MoE layer (3 of 4) one all-gather and one reduce-scatter of 262144 bytes, each 3/4 sent, and one gather of
  // the 4 replicas' token counts (32 bytes); no logits gather (each replica's head is whole).
  const auto cs = step_collectives(CommScheme::kDpAttention, moe_model(), 4, 1, {64, 64});
  const CollectiveStats s = predicted_stats(cs);
  expect_kind(s, CollectiveKind::kAllGather, 4, 3 * 262144 + 32);
  expect_kind(s, CollectiveKind::kReduceScatter, 3, 3 * 262144);
  expect_kind(s, CollectiveKind::kAllReduce, 0, 0);
  EXPECT_DOUBLE_EQ(sent_bytes_per_step(cs), 6 * 196608.0 + 24.0);
}

TEST(CommCost, DpAttentionAllToAllDispatchesEachMoeLayer) {
  // Per MoE layer (3): one gather of the 4 ranks' layouts (8 experts + 4 ranks counts of 8 bytes each: 4 x 96 = 384
  // bytes), a dispatch and a combine. ep 4: a rank owns 2 of the 8 experts, so a token reaches it with probability
  // 13/28 (see ExpertAllToAllByHand); a replica's 16 tokens go to each of 4 ranks: 64 x 13/28 rows of (1024 + 4) x 4
  // bytes out, of 1024 x 4 back; 3/4 of them to other ranks.
  const auto cs = step_collectives(CommScheme::kDpAttentionAllToAll, moe_model(), 4, 4, {64, 64});
  const CollectiveStats s = predicted_stats(cs);
  expect_kind(s, CollectiveKind::kAllGather, 3, 3 * 384);
  const double rows = 64.0 * 13 / 28;
  expect_kind(s, CollectiveKind::kAllToAll, 6, 3 * std::llround(rows * 1028 * 4) + 3 * std::llround(rows * 1024 * 4));
  expect_kind(s, CollectiveKind::kAllReduce, 0, 0);
  expect_kind(s, CollectiveKind::kReduceScatter, 0, 0);
  EXPECT_NEAR(sent_bytes_per_step(cs), 3 * 288.0 + 3 * rows * 3 / 4 * (1028 + 1024) * 4, 1e-6);
  // ep 1: every rank owns a slice of every expert, so every token goes to every rank.
  const auto all = predicted_stats(step_collectives(CommScheme::kDpAttentionAllToAll, moe_model(), 4, 1, {64, 64}));
  expect_kind(all, CollectiveKind::kAllToAll, 6, 3 * 64 * 1028 * 4 + 3 * 64 * 1024 * 4);
}

TEST(CommCost, OneRankOrNoTokensRunNothingAndBadLayoutsAreUsageErrors) {
  EXPECT_TRUE(step_collectives(CommScheme::kTensorParallel, moe_model(), 1, 1, {64, 64}).empty());
  EXPECT_TRUE(step_collectives(CommScheme::kTensorParallel, moe_model(), 4, 1, {0, 0}).empty());
  // A prefill chunk that ends no prompt gathers no logits.
  EXPECT_EQ(totals_of(predicted_stats(step_collectives(CommScheme::kTensorParallel, moe_model(), 2, 1, {16, 0})), CollectiveKind::kAllGather).calls, 0);
  EXPECT_THROW(step_collectives(CommScheme::kTensorParallel, moe_model(), 4, 3, {64, 64}), Error);
  EXPECT_THROW(step_collectives(CommScheme::kTensorParallel, moe_model(), 0, 1, {64, 64}), Error);
}

TEST(CommCost, InterconnectsAndTheDryRunLine) {
  ASSERT_NE(find_interconnect("nvlink4"), nullptr);
  EXPECT_DOUBLE_EQ(find_interconnect("nvlink4")->gb_per_s, 450.0);
  EXPECT_DOUBLE_EQ(find_interconnect("100gbe")->gb_per_s, 12.5);
  EXPECT_DOUBLE_EQ(find_interconnect("400gbe")->gb_per_s, 50.0);
  ASSERT_NE(find_interconnect("mi300x-if"), nullptr);
  EXPECT_EQ(find_interconnect("pcie"), nullptr);
  const std::vector<const Interconnect*> links = {&kCommLink};
  const std::string moe = comm_cost_line("decode step", moe_model(), 4, 4, {64, 64}, links);
  EXPECT_EQ(moe.rfind("comm per decode step (64 tokens): TP all-reduce sends ", 0), 0u) << moe;
  EXPECT_NE(moe.find("195 us test"), std::string::npos) << moe;  // the hand-computed 194.9 us
  EXPECT_NE(moe.find("EP all-to-all (not implemented)"), std::string::npos) << moe;
  EXPECT_NE(moe.find("; DP attention sends "), std::string::npos) << moe;
  EXPECT_NE(moe.find("; DP attention + all-to-all sends "), std::string::npos) << moe;
  ModelInfo dense = moe_model();
  dense.experts = 0;
  EXPECT_EQ(comm_cost_line("decode step", dense, 4, 1, {64, 64}, links).find("EP all-to-all"), std::string::npos);
  EXPECT_EQ(comm_cost_line("decode step", dense, 4, 1, {64, 64}, links).find("DP attention"), std::string::npos);
  EXPECT_TRUE(comm_cost_line("decode step", dense, 1, 1, {64, 64}, links).empty());
}

constexpr const char* kCommSweep = R"(
name: t
target: {engine: builtin, model: m.gguf}
workloads: [{name: short, dataset: random, input_len: 16, output_len: 4, num_prompts: 8}]
)";

TEST(CommCost, SweepFileNamesTheInterconnects) {
  EXPECT_EQ(parse_sweep(parse_spec_text(kCommSweep, "t.yaml")).interconnects, (std::vector<std::string>{"nvlink4", "400gbe"}));
  EXPECT_EQ(parse_sweep(parse_spec_text(std::string(kCommSweep) + "interconnects: [mi300x-if, 100gbe]\n", "t.yaml")).interconnects,
            (std::vector<std::string>{"mi300x-if", "100gbe"}));
  try {
    parse_sweep(parse_spec_text(std::string(kCommSweep) + "interconnects: pcie\n", "t.yaml"));
    ADD_FAILURE() << "no error for an unknown interconnect";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("unknown interconnect 'pcie'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nvlink4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune::tuner
