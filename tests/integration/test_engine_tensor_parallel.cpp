// Tensor parallelism over the local communicator on stories260K and random-weight llamas (make-model's `tiny`, 4 heads /
// 2 KV heads, and `tiny-gqa`, 12 heads / 3 KV heads / vocab 500): logits of tp 2, 3, 4 and 6 (uneven KV groups,
// replicated KV heads, uneven vocabulary split) match tp 1 within 1e-5 relative; greedy outputs of a mixed batch with
// chunked prefill are identical to tp 1, also with tp 2 x dp 2; collective time is reported; bad splits are clear errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "model/checkpoint.h"
#include "runtime/tensor_parallel_group.h"
#include "servetune/engine.h"
#include "integration/greedy_jobs.h"
#include "integration/random_model.h"
#include "integration/tp_logits.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

// Runs tp 1 and each of `tp_sizes` (local communicator, one thread per rank) through expect_groups_match.
void expect_logits_match(const std::string& model, const std::vector<int>& tp_sizes) {
  Checkpoint ck(model, LoadFormat::kAuto);
  std::vector<int> sizes = {1};
  sizes.insert(sizes.end(), tp_sizes.begin(), tp_sizes.end());
  std::vector<std::unique_ptr<TensorParallelGroup>> owned;
  std::vector<TensorParallelGroup*> groups;
  std::vector<std::string> names;
  for (int tp : sizes) {
    owned.push_back(std::make_unique<TensorParallelGroup>(ck, "cpu", tp, 1));
    owned.back()->create_kv(testing::kLogitsKvBlocks, testing::kPage, DType::kF32);
    groups.push_back(owned.back().get());
    names.push_back("tp " + std::to_string(tp));
  }
  testing::expect_groups_match(model, groups, names);
}

TEST(TensorParallelLogits, StoriesMatchOneRank) {
  expect_logits_match(testing::stories_path(), {2, 4});
}

TEST(TensorParallelLogits, RandomLlamaWithUnevenAndReplicatedKvHeadsMatchesOneRank) {
  const testing::RandomModel gqa("tiny-gqa");
  expect_logits_match(gqa.path(), {2, 3, 6});  // KV groups 2+1 (uneven), 1 each, each replicated on 2 ranks
  const testing::RandomModel tiny("tiny");
  expect_logits_match(tiny.path(), {2, 4});  // 2 KV heads replicated over 4 ranks
}

using testing::Job;

EngineConfig config_for(const std::string& model, int tp, int dp) {
  EngineConfig c = testing::chunked_config(model);
  c.threads = std::max(2, tp * dp);
  c.tp_size = tp;
  c.dp_size = dp;
  return c;
}

void expect_greedy_identical(const std::string& model, const std::vector<std::pair<int, int>>& layouts) {
  std::vector<Job> jobs;
  std::vector<std::vector<int32_t>> reference;
  {
    Engine engine(config_for(model, 1, 1));
    jobs = testing::mixed_jobs(engine.tokenizer(), 16, 40);
    reference = testing::run_greedy(engine, jobs, true);
    EXPECT_EQ(engine.stats().comm_seconds, 0.0);
  }
  for (size_t i = 0; i < jobs.size(); ++i) ASSERT_EQ(reference[i].size(), static_cast<size_t>(jobs[i].max_tokens));
  for (const auto& [tp, dp] : layouts) {
    Engine engine(config_for(model, tp, dp));
    const auto outs = testing::run_greedy(engine, jobs, true);
    for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(outs[i], reference[i]) << model << " tp " << tp << " dp " << dp << ": request " << i;
    const EngineStats s = engine.stats();
    EXPECT_GT(s.comm_seconds, 0.0) << "tp " << tp;
    EXPECT_GT(s.forward_seconds, s.comm_seconds) << "tp " << tp;
    EXPECT_EQ(s.kv_blocks_used, 0);
  }
}

TEST(EngineTensorParallel, StoriesGreedyOutputsIdenticalToOneRankWithChunkedPrefill) {
  expect_greedy_identical(testing::stories_path(), {{2, 1}, {4, 1}, {2, 2}});
}

TEST(EngineTensorParallel, RandomLlamaGreedyOutputsIdenticalToOneRank) {
  const testing::RandomModel gqa("tiny-gqa");
  expect_greedy_identical(gqa.path(), {{2, 1}, {6, 1}, {2, 2}});
}

void expect_usage_error(const EngineConfig& c, const std::vector<std::string>& words) {
  try {
    Engine engine(c);
    ADD_FAILURE() << "expected an error for tp " << c.tp_size;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(EngineTensorParallel, SplitsThatDoNotFitAreClearErrors) {
  const testing::RandomModel gqa("tiny-gqa");
  // 12 heads in 3 KV groups cannot go over 4 ranks (4 is neither <= 3 nor a multiple of 3).
  expect_usage_error(config_for(gqa.path(), 4, 1), {"tp_size 4", "12 attention heads", "3 KV heads"});
  // stories260K's feed-forward dimension 172 does not divide by 8.
  expect_usage_error(config_for(testing::stories_path(), 8, 1), {"tp_size 8", "feed-forward dimension 172"});
  // tp x dp ranks need a thread each.
  EngineConfig c = config_for(testing::stories_path(), 2, 2);
  c.threads = 3;
  expect_usage_error(c, {"tp_size x dp_size = 4 ranks need at least one thread each, but threads = 3"});
}

}  // namespace
}  // namespace servetune
