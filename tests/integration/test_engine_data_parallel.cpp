// Data parallelism end to end on stories260K and a random-weight llama (make-model's `tiny`): dp_size 2 gives greedy
// outputs identical to dp_size 1 under both load-balance methods, its stats sum over the replicas, aborts reach the replica holding the request, and
// settings that do not fit are clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "model/make_model.h"
#include "servetune/engine.h"
#include "integration/greedy_jobs.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace servetune {
namespace {

using testing::drain;
using testing::Job;
using testing::run_greedy;

EngineConfig config_for(int dp, const std::string& method = "round_robin") {
  EngineConfig c;
  c.model = testing::stories_path();
  c.threads = 2;
  c.dp_size = dp;
  c.load_balance_method = parse_load_balance_method(method);
  c.max_total_tokens = 32768;
  return c;
}

TEST(EngineDataParallel, GreedyOutputsIdenticalToOneReplicaUnderBothMethods) {
  std::vector<Job> jobs;
  std::vector<std::vector<int32_t>> reference;
  int64_t reference_blocks = 0;
  {
    Engine engine(config_for(1));
    jobs = testing::mixed_jobs(engine.tokenizer(), 24, 48);
    reference = run_greedy(engine, jobs);
    reference_blocks = engine.stats().kv_blocks_total;
  }
  for (const std::string method : {"round_robin", "shortest_queue"}) {
    Engine engine(config_for(2, method));
    EXPECT_EQ(engine.kv_capacity_tokens(), 32768 / 2) << "each replica holds half of max_total_tokens";
    const auto outs = run_greedy(engine, jobs);
    int64_t generated = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(outs[i], reference[i]) << method << ": request " << i;
      generated += static_cast<int64_t>(outs[i].size());
    }
    // Stats sum over the replicas.
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.requests_finished, static_cast<int64_t>(jobs.size())) << method;
    EXPECT_EQ(s.generation_tokens, generated) << method;
    EXPECT_EQ(s.kv_blocks_total, reference_blocks) << method;
    EXPECT_EQ(s.kv_blocks_used, 0) << method;
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total) << method;
    EXPECT_EQ(s.running + s.waiting, 0) << method;
    EXPECT_GT(s.steps, 0) << method;
    EXPECT_GT(s.mean_running(), 0.0) << method;
  }
}

TEST(EngineDataParallel, RandomWeightLlamaGreedyOutputsIdenticalToOneReplica) {
  const auto dir = std::filesystem::temp_directory_path() / ("servetune_dp_tiny_" + std::to_string(::getpid()));
  write_random_model(model_preset("tiny"), dir.string(), 7, DType::kF32, 0.02f);
  std::vector<Job> jobs;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> prompt;
    for (int k = 0; k < 3 + (i * 5) % 40; ++k) prompt.push_back(3 + (i * 31 + k * 7) % 500);
    jobs.push_back({prompt, 4 + (i * 13) % 60});
  }
  const auto run = [&](int dp, const std::string& method) {
    EngineConfig c = config_for(dp, method);
    c.model = dir.string();
    Engine engine(c);
    return run_greedy(engine, jobs, true);
  };
  const auto reference = run(1, "round_robin");
  for (size_t i = 0; i < jobs.size(); ++i) ASSERT_EQ(reference[i].size(), static_cast<size_t>(jobs[i].max_tokens));
  EXPECT_EQ(run(2, "round_robin"), reference);
  EXPECT_EQ(run(2, "shortest_queue"), reference);
  std::filesystem::remove_all(dir);
}

TEST(EngineDataParallel, RunningRequestsSumOverReplicasAndAbortReachesTheRightOne) {
  Engine engine(config_for(2, "round_robin"));
  const auto prompt = engine.tokenizer().encode("Once upon a time");
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(testing::submit_greedy(engine, {prompt, 400}));  // replicas 0, 1, 0, 1
  // The second (on replica 1) and third (on replica 0) are aborted at once, long before 400 tokens can be made.
  EXPECT_TRUE(engine.abort(streams[1]->id()));
  EXPECT_TRUE(engine.abort(streams[2]->id()));
  EXPECT_FALSE(engine.abort(999999));
  ASSERT_TRUE(streams[0]->next().has_value());
  ASSERT_TRUE(streams[3]->next().has_value());
  const EngineStats busy = engine.stats();  // one request running on each replica
  EXPECT_EQ(busy.running + busy.waiting, 2);
  EXPECT_GT(busy.kv_blocks_used, 0);
  std::vector<FinishReason> reasons;
  for (auto& s : streams) {
    std::vector<int32_t> out;
    reasons.push_back(drain(*s, out));
  }
  EXPECT_EQ(reasons, (std::vector<FinishReason>{FinishReason::kLength, FinishReason::kAbort, FinishReason::kAbort, FinishReason::kLength}));
  EXPECT_FALSE(engine.abort(streams[0]->id()));  // already finished
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.requests_aborted, 2);
  EXPECT_EQ(s.requests_finished, 2);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

TEST(EngineDataParallel, SettingsThatDoNotFitAreClearErrors) {
  EngineConfig c = config_for(3);
  try {
    Engine engine(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("3 ranks need at least one thread each, but threads = 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(config_for(2, "random"), Error);  // not a method: rejected where the text is read
  // A request too big for one replica's half of the KV cache is refused with the capacity named.
  c = config_for(2);
  c.max_total_tokens = 256;
  Engine engine(c);
  Request r;
  r.prompt_ids = {1, 2, 3};
  r.sampling.max_tokens = 200;
  try {
    engine.submit(r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidRequest);
    EXPECT_NE(std::string(e.what()).find("KV cache capacity (128 tokens)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune
