// EngineStats: the ratios derived from its counters, the sum over data-parallel replicas, and the difference over a
// measured run (what `bench` and the sweep report as engine_* keys), per-kind collective totals included.
#include <gtest/gtest.h>

#include "servetune/engine.h"

namespace servetune {
namespace {

TEST(EngineStats, RatiosAreZeroWithoutADenominator) {
  const EngineStats s;
  EXPECT_EQ(s.kv_usage(), 0.0);
  EXPECT_EQ(s.prefix_cache_hit_rate(), 0.0);
  EXPECT_EQ(s.mean_batch_tokens(), 0.0);
  EXPECT_EQ(s.mean_running(), 0.0);
  EXPECT_EQ(s.spec_acceptance_rate(), 0.0);
  EXPECT_EQ(s.spec_mean_accepted_length(), 0.0);
}

EngineStats replica(int64_t steps, int64_t seqs, int64_t tokens, int64_t max_batch) {
  EngineStats s;
  s.running = 1;
  s.kv_blocks_total = 100;
  s.kv_blocks_used = 25;
  s.kv_blocks_free = 75;
  s.page_size = 16;
  s.prefix_query_tokens = 40;
  s.prefix_hit_tokens = 10;
  s.steps = steps;
  s.batched_seqs = seqs;
  s.batched_tokens = tokens;
  s.max_batch_tokens = max_batch;
  s.spec_num_drafts = 4;
  s.spec_draft_tokens = 12;
  s.spec_accepted_tokens = 6;
  s.spec_accepted_per_position = {3, 2, 1};
  totals_of(s.collectives, CollectiveKind::kAllReduce) = {2 * steps, 1000 * tokens, 0.25 * static_cast<double>(steps)};
  return s;
}

TEST(EngineStats, RatiosOfOneReplica) {
  const EngineStats s = replica(4, 10, 100, 40);
  EXPECT_DOUBLE_EQ(s.kv_usage(), 0.25);
  EXPECT_DOUBLE_EQ(s.prefix_cache_hit_rate(), 0.25);
  EXPECT_DOUBLE_EQ(s.mean_batch_tokens(), 25.0);
  EXPECT_DOUBLE_EQ(s.mean_running(), 2.5);
  EXPECT_DOUBLE_EQ(s.spec_acceptance_rate(), 0.5);
  EXPECT_DOUBLE_EQ(s.spec_mean_accepted_length(), 2.5);
}

TEST(EngineStats, ReplicasSumAndRatiosComeFromTheSums) {
  EngineStats a = replica(4, 10, 100, 40);
  EngineStats b = replica(1, 5, 60, 60);
  b.kv_blocks_used = 75;
  b.kv_blocks_free = 25;
  b.spec_accepted_per_position = {4};
  EngineStats sum;
  sum.add_replica(a);
  sum.add_replica(b);
  EXPECT_EQ(sum.running, 2);
  EXPECT_EQ(sum.kv_blocks_total, 200);
  EXPECT_EQ(sum.kv_blocks_free, 100);
  EXPECT_EQ(sum.page_size, 16);
  EXPECT_EQ(sum.steps, 5);
  EXPECT_EQ(sum.max_batch_tokens, 60);
  EXPECT_EQ(sum.spec_accepted_per_position, (std::vector<int64_t>{7, 2, 1}));
  EXPECT_EQ(totals_of(sum.collectives, CollectiveKind::kAllReduce).calls, 10);
  EXPECT_EQ(totals_of(sum.collectives, CollectiveKind::kAllReduce).bytes, 160000);
  EXPECT_DOUBLE_EQ(totals_of(sum.collectives, CollectiveKind::kAllReduce).seconds, 1.25);
  EXPECT_EQ(totals_of(sum.collectives, CollectiveKind::kAllToAll).calls, 0);
  EXPECT_DOUBLE_EQ(sum.kv_usage(), 0.5);
  EXPECT_DOUBLE_EQ(sum.mean_batch_tokens(), 32.0);
  EXPECT_DOUBLE_EQ(sum.mean_running(), 3.0);  // weighted by steps, not the mean of 2.5 and 5
  EXPECT_DOUBLE_EQ(sum.spec_acceptance_rate(), 0.5);
}

TEST(EngineStats, SinceTakesCountersOverTheRunAndGaugesNow) {
  const EngineStats before = replica(4, 10, 100, 40);
  EngineStats after = replica(10, 40, 400, 80);
  after.running = 3;
  after.prefix_query_tokens = 100;
  after.prefix_hit_tokens = 70;
  after.forward_seconds = 2.5;
  after.spec_num_drafts = 6;
  after.spec_accepted_per_position = {5, 2, 1, 1};  // a position the earlier snapshot had not seen
  const EngineStats d = after.since(before);
  EXPECT_EQ(d.steps, 6);
  EXPECT_EQ(d.batched_tokens, 300);
  EXPECT_EQ(d.running, 3);
  EXPECT_EQ(d.kv_blocks_used, 25);
  EXPECT_EQ(d.max_batch_tokens, 80);
  EXPECT_DOUBLE_EQ(d.forward_seconds, 2.5);
  EXPECT_EQ(d.spec_num_drafts, 2);
  EXPECT_EQ(d.spec_accepted_per_position, (std::vector<int64_t>{2, 0, 0, 1}));
  EXPECT_EQ(totals_of(d.collectives, CollectiveKind::kAllReduce).calls, 12);
  EXPECT_EQ(totals_of(d.collectives, CollectiveKind::kAllReduce).bytes, 300000);
  EXPECT_DOUBLE_EQ(totals_of(d.collectives, CollectiveKind::kAllReduce).seconds, 1.5);
  EXPECT_DOUBLE_EQ(d.mean_batch_tokens(), 50.0);
  EXPECT_DOUBLE_EQ(d.mean_running(), 5.0);
  EXPECT_DOUBLE_EQ(d.prefix_cache_hit_rate(), 1.0);  // 60 of 60 queried tokens over the run
}

}  // namespace
}  // namespace servetune
