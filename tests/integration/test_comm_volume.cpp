// The collectives the engine counts per kind against what the code runs and what the cost model (tuner/comm_cost)
// predicts, on make-model's `tiny` llama (tp 2) and deepseek-v3-tiny (tp 2, and ep 2) over the local communicator:
// per step 2 all-reduces of tokens x hidden x 4 bytes per layer (attention and FFN, the experts' partial sums joining
// the FFN's) and one all-gather of logits rows x vocab x 4 bytes, exactly; no other kind; the engine's stats and
// its per-kind JSON keys carry the same totals.
#include <gtest/gtest.h>

#include "model/checkpoint.h"
#include "runtime/tensor_parallel_group.h"
#include "servetune/engine.h"
#include "servetune/model_info.h"
#include "integration/greedy_jobs.h"
#include "integration/random_model.h"
#include "integration/tp_logits.h"
#include "tuner/comm_cost.h"
#include "tuner/measurement.h"

namespace servetune {
namespace {

void expect_totals_equal(const CollectiveStats& measured, const CollectiveStats& expected, const std::string& label) {
  for (size_t k = 0; k < kCollectiveKinds; ++k) {
    const char* kind = collective_kind_name(static_cast<CollectiveKind>(k));
    EXPECT_EQ(measured[k].calls, expected[k].calls) << label << ": " << kind << " calls";
    EXPECT_EQ(measured[k].bytes, expected[k].bytes) << label << ": " << kind << " bytes";
  }
}

// Runs three prompts' first chunk (8 + 8 + 5 tokens; the 5-token prompt ends, so one logits row) on a tp x ep group
// and checks its counters against the code's arithmetic and the cost model's prediction.
void expect_step_volume(const std::string& model, int tp, int ep) {
  const std::string label = model + " tp " + std::to_string(tp) + " ep " + std::to_string(ep);
  const Checkpoint ck(model, LoadFormat::kAuto);
  TensorParallelGroup group(ck, "cpu", tp, 1, CompileOptions{}, kDefaultCommTimeout, ep);
  group.create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
  std::vector<testing::SeqState> seqs(3);
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int k = 0; k < 5 + 9 * static_cast<int>(i); ++k) seqs[i].tokens.push_back(3 + k);
    seqs[i].first_block = static_cast<int32_t>(i * testing::kLogitsMaxBlocks);
  }
  const Batch batch = testing::next_batch(seqs, 8, testing::kLogitsMaxBlocks);
  ASSERT_EQ(batch.n_tokens(), 21);
  ASSERT_EQ(batch.logits_indices.size(), 1u);
  std::vector<float> logits;
  group.forward(batch, logits);

  const ModelInfo info = read_model_info(model);
  CollectiveStats by_hand{};
  totals_of(by_hand, CollectiveKind::kAllReduce) = {2 * info.n_layers, 2 * info.n_layers * 21 * info.hidden * 4, 0.0};
  totals_of(by_hand, CollectiveKind::kAllGather) = {1, 1 * info.vocab * 4, 0.0};
  expect_totals_equal(group.collective_stats(), by_hand, label + " (by hand)");

  const auto predicted = tuner::step_collectives(tuner::CommScheme::kTensorParallel, info, tp, ep, {21, 1});
  expect_totals_equal(group.collective_stats(), tuner::predicted_stats(predicted), label + " (cost model)");
  EXPECT_GT(totals_of(group.collective_stats(), CollectiveKind::kAllReduce).seconds, 0.0) << label;
}

TEST(CommVolume, TensorParallelLlamaStepMatchesTheCodeAndTheCostModel) {
  const testing::RandomModel m("tiny");
  expect_step_volume(m.path(), 2, 1);
}

TEST(CommVolume, ExpertParallelMoeStepMatchesTheCodeAndTheCostModel) {
  const testing::RandomModel m("deepseek-v3-tiny");
  expect_step_volume(m.path(), 2, 1);
  expect_step_volume(m.path(), 2, 2);
}

// Through the engine: over a whole run, every step's all-reduces carry its tokens, so the all-reduce bytes are
// 2 x layers x hidden x 4 x batched tokens; at most one all-gather per step, of one row per generated token.
TEST(CommVolume, EngineStatsCountEveryStep) {
  const testing::RandomModel m("tiny");
  const ModelInfo info = read_model_info(m.path());
  EngineConfig c = testing::chunked_config(m.path());
  c.threads = 2;
  c.tp_size = 2;
  Engine engine(c);
  testing::run_greedy(engine, testing::mixed_jobs(engine.tokenizer(), 4, 6), true);
  const EngineStats s = engine.stats();
  const CollectiveTotals& ar = totals_of(s.collectives, CollectiveKind::kAllReduce);
  const CollectiveTotals& ag = totals_of(s.collectives, CollectiveKind::kAllGather);
  ASSERT_GT(s.steps, 0);
  EXPECT_EQ(ar.calls, 2 * info.n_layers * s.steps);
  EXPECT_EQ(ar.bytes, 2 * info.n_layers * info.hidden * 4 * s.batched_tokens);
  EXPECT_GT(ag.calls, 0);
  EXPECT_LE(ag.calls, s.steps);
  ASSERT_EQ(s.preemptions, 0);
  EXPECT_EQ(ag.bytes, s.generation_tokens * info.vocab * 4);  // one logits row per generated token
  for (CollectiveKind k : {CollectiveKind::kReduceScatter, CollectiveKind::kAllToAll, CollectiveKind::kBroadcast, CollectiveKind::kBarrier}) {
    EXPECT_EQ(totals_of(s.collectives, k).calls, 0) << collective_kind_name(k);
    EXPECT_EQ(totals_of(s.collectives, k).bytes, 0) << collective_kind_name(k);
  }
  double kinds_seconds = 0.0;
  for (const CollectiveTotals& t : s.collectives) kinds_seconds += t.seconds;
  EXPECT_NEAR(kinds_seconds, s.comm_seconds, 1e-9);  // threads: no step messages, every collective has a kind

  // The record's keys (bench JSON, sweep records) carry the same totals over the measured run.
  tuner::Measurement run;
  run.stats_before = EngineStats{};
  run.stats_after = s;
  const auto j = tuner::engine_stats_json(run);
  EXPECT_EQ(j.at("engine_comm_all_reduce_bytes").get<int64_t>(), ar.bytes);
  EXPECT_EQ(j.at("engine_comm_all_reduce_calls").get<int64_t>(), ar.calls);
  EXPECT_DOUBLE_EQ(j.at("engine_comm_all_reduce_seconds").get<double>(), ar.seconds);
  EXPECT_EQ(j.at("engine_comm_all_gather_bytes").get<int64_t>(), ag.bytes);
  EXPECT_EQ(j.at("engine_comm_all_to_all_bytes").get<int64_t>(), 0);
  EXPECT_EQ(j.at("engine_comm_reduce_scatter_calls").get<int64_t>(), 0);
}

// The engine's stats after mixed greedy jobs with DP attention on 2 replicas. Replica 0 may still be in the last step
// (an idle batch for replica 1's last token) when the last request ends: its counters are final once the replicas
// stopped.
EngineStats dp_attention_run(const std::string& model, int ep, MoeA2aBackend a2a) {
  EngineConfig c = testing::chunked_config(model);
  c.threads = 2;
  c.tp_size = 2;
  c.dp_size = 2;
  c.ep_size = ep;
  c.enable_dp_attention = true;
  c.moe_a2a_backend = a2a;
  Engine engine(c);
  testing::run_greedy(engine, testing::mixed_jobs(engine.tokenizer(), 4, 6), true);
  engine.shutdown();
  return engine.stats();
}

// DP attention (2 replicas) through the engine: replica 0's counters (it joins every step) carry, per MoE layer and
// step, a reduce-scatter of every replica's tokens x hidden x 4 bytes and an all-gather of the same, plus one gather
// of the 2 replicas' counts per step; as the cost model's DP attention scheme says per step.
TEST(CommVolume, DpAttentionEngineStatsMatchTheCodeAndTheCostModel) {
  const testing::RandomModel m("deepseek-v3-tiny");
  const ModelInfo info = read_model_info(m.path());
  const int64_t moe_layers = info.n_layers - info.dense_layers;
  const EngineStats s = dp_attention_run(m.path(), 1, MoeA2aBackend::kNone);
  const CollectiveTotals& rs = totals_of(s.collectives, CollectiveKind::kReduceScatter);
  const CollectiveTotals& ag = totals_of(s.collectives, CollectiveKind::kAllGather);
  ASSERT_GT(s.batched_tokens, 0);
  EXPECT_EQ(rs.bytes, moe_layers * info.hidden * 4 * s.batched_tokens);
  ASSERT_EQ(rs.calls % moe_layers, 0);
  const int64_t lockstep_steps = rs.calls / moe_layers;
  EXPECT_GE(lockstep_steps * 2, s.steps + s.idle_batches);  // both replicas' steps, each at most one per lockstep step
  EXPECT_EQ(ag.calls, lockstep_steps * (moe_layers + 1));
  EXPECT_EQ(ag.bytes, rs.bytes + lockstep_steps * 2 * 8);
  EXPECT_EQ(totals_of(s.collectives, CollectiveKind::kAllReduce).calls, 0);
  // One step of 21 tokens in all, as the cost model has it.
  const CollectiveStats one = tuner::predicted_stats(tuner::step_collectives(tuner::CommScheme::kDpAttention, info, 2, 1, {21, 1}));
  EXPECT_EQ(totals_of(one, CollectiveKind::kReduceScatter).bytes, moe_layers * info.hidden * 4 * 21);
  EXPECT_EQ(totals_of(one, CollectiveKind::kAllGather).calls, moe_layers + 1);
  EXPECT_EQ(totals_of(one, CollectiveKind::kAllGather).bytes, moe_layers * info.hidden * 4 * 21 + 2 * 8);
}

// DP attention with all-to-all dispatch (2 replicas, ep 2): replica 0's counters carry, per MoE layer and lockstep
// step, one gather of both layouts (experts + 2 counts of 8 bytes each, per replica) and two all-to-alls (dispatch,
// combine), as the code and the cost model's scheme say; the rows moved depend on the routing, so only their bounds
// are checked: each of replica 0's rows goes to at most both ranks, at (hidden + 2 top_k) values out.
TEST(CommVolume, DpAttentionAllToAllEngineStatsMatchTheCodeAndTheCostModel) {
  const testing::RandomModel m("deepseek-v3-tiny");
  const ModelInfo info = read_model_info(m.path());
  const int64_t moe_layers = info.n_layers - info.dense_layers;
  const EngineStats s = dp_attention_run(m.path(), 2, MoeA2aBackend::kDeepep);
  const CollectiveTotals& a2a = totals_of(s.collectives, CollectiveKind::kAllToAll);
  const CollectiveTotals& ag = totals_of(s.collectives, CollectiveKind::kAllGather);
  ASSERT_GT(s.batched_tokens, 0);
  ASSERT_GT(ag.calls, 0);
  ASSERT_EQ(ag.calls % moe_layers, 0);
  const int64_t lockstep_steps = ag.calls / moe_layers;
  EXPECT_GE(lockstep_steps * 2, s.steps + s.idle_batches);
  const int64_t layout_bytes = 2 * (info.experts + 2) * 8;
  EXPECT_EQ(ag.bytes, ag.calls * layout_bytes);
  EXPECT_EQ(a2a.calls, 2 * ag.calls);
  EXPECT_GT(a2a.bytes, 0);
  EXPECT_LE(a2a.bytes, moe_layers * s.batched_tokens * 2 * (2 * info.hidden + 2 * info.experts_per_token) * 4);
  EXPECT_EQ(totals_of(s.collectives, CollectiveKind::kReduceScatter).calls, 0);
  EXPECT_EQ(totals_of(s.collectives, CollectiveKind::kAllReduce).calls, 0);
  const CollectiveStats one = tuner::predicted_stats(tuner::step_collectives(tuner::CommScheme::kDpAttentionAllToAll, info, 2, 2, {21, 1}));
  EXPECT_EQ(totals_of(one, CollectiveKind::kAllGather).calls, moe_layers);
  EXPECT_EQ(totals_of(one, CollectiveKind::kAllGather).bytes, moe_layers * layout_bytes);
  EXPECT_EQ(totals_of(one, CollectiveKind::kAllToAll).calls, 2 * moe_layers);
}

}  // namespace
}  // namespace servetune
