// The in-process client on the built-in engine with stories260K: token counts and timings come from the engine's
// events, arrival times and the concurrency cap are honoured, and rejected requests fail with the engine's reason.
#include <gtest/gtest.h>

#include "datasets/dataset.h"
#include "loadgen/inprocess_client.h"
#include "servetune/engine.h"
#include "test_paths.h"

namespace servetune::loadgen {
namespace {

TEST(InProcessClient, RunsAPlanOnTheEngine) {
  EngineConfig config;
  config.model = testing::stories_path();
  config.threads = 1;
  Engine engine(config);
  datasets::DatasetOptions d;
  d.name = "random";
  d.num_prompts = 12;
  d.random_input_len = 20;
  d.random_output_len = 9;
  d.random_range_ratio = 0.3;
  const datasets::Workload w = datasets::load_workload(d, engine.tokenizer());
  std::vector<datasets::SampleRequest> reqs = w.requests;
  reqs.push_back(reqs[0]);
  reqs.back().output_len = 100000;  // beyond the context: the engine rejects it

  RunSpec spec;
  spec.max_concurrency = 3;
  spec.params.ignore_eos = true;
  spec.params.temperature = 0.0;
  for (size_t i = 0; i < reqs.size(); ++i) spec.requests.push_back({&reqs[i], 0.002 * static_cast<double>(i)});
  InProcessClient client(engine);
  const RunResult r = client.run(spec);
  ASSERT_EQ(r.outputs.size(), reqs.size());
  for (size_t i = 0; i + 1 < reqs.size(); ++i) {
    const RequestOutput& o = r.outputs[i];
    ASSERT_TRUE(o.success) << o.error;
    EXPECT_EQ(o.failure, RequestFailure::kNone);
    EXPECT_EQ(o.output_tokens, reqs[i].output_len);
    EXPECT_EQ(o.prompt_len, reqs[i].prompt_len);  // the engine's usage agrees with the dataset's count
    int64_t chunk_tokens = 0;
    for (int32_t n : o.chunk_tokens) chunk_tokens += n;
    EXPECT_EQ(chunk_tokens, o.output_tokens);
    EXPECT_EQ(o.itl.size() + 1, o.chunk_tokens.size());
    EXPECT_GT(o.ttft, 0.0);
    EXPECT_GE(o.latency, o.ttft);
    EXPECT_GE(o.start_time + 1e-9, o.scheduled_time);
    EXPECT_FALSE(o.generated_text.empty());
    EXPECT_GE(o.read_lags.size(), o.chunk_tokens.size());  // every event read, token events and the finish
    for (double lag : o.read_lags) EXPECT_GE(lag, 0.0);  // drained after the engine stamped it, same clock
  }
  EXPECT_FALSE(r.outputs.back().success);
  EXPECT_NE(r.outputs.back().error.find("rejected by the engine"), std::string::npos) << r.outputs.back().error;
  EXPECT_EQ(r.outputs.back().failure, RequestFailure::kRejected);
  const BenchmarkMetrics m = compute_metrics(r.outputs, r.duration_s, {99}, {});
  EXPECT_LE(m.max_concurrent_requests, 3);
  EXPECT_EQ(m.completed, 12);
  EXPECT_TRUE(m.client_lag_ms.has_value());
}

}  // namespace
}  // namespace servetune::loadgen

namespace servetune::loadgen {
namespace {

// Sessions on the engine: a later turn, whose prompt extends the previous one, is sent after that reply and finds
// its prefix in the engine's cache (usage.cached_tokens); with the cache off it finds none.
TEST(InProcessClient, SessionTurnsFollowTheirRepliesAndHitThePrefixCache) {
  for (const bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "prefix cache on" : "prefix cache off");
    EngineConfig config;
    config.model = testing::stories_path();
    config.threads = 1;
    config.disable_radix_cache = !cache;
    Engine engine(config);
    datasets::DatasetOptions d;
    d.name = "random";
    d.num_prompts = 6;
    d.random_input_len = 64;
    d.random_output_len = 4;
    const datasets::Workload w = datasets::load_workload(d, engine.tokenizer());
    // Two sessions of three turns; turn t's prompt is the previous turn's plus another random prompt.
    std::vector<datasets::SampleRequest> reqs;
    for (int s = 0; s < 2; ++s) {
      std::string prompt;
      for (int t = 0; t < 3; ++t) {
        datasets::SampleRequest r = w.requests[static_cast<size_t>(3 * s + t)];
        prompt += r.prompt;
        r.prompt = prompt;
        r.prompt_len = static_cast<int64_t>(engine.tokenizer().encode(prompt, true, false).size());
        r.session = s;
        r.turn = t;
        reqs.push_back(r);
      }
    }
    RunSpec spec;
    spec.sessions = true;
    spec.max_concurrency = 2;
    spec.params.ignore_eos = true;
    for (const auto& r : reqs) spec.requests.push_back({&r, 0.0, r.turn > 0 ? 0.01 : 0.0});
    InProcessClient client(engine);
    const RunResult r = client.run(spec);
    for (size_t i = 0; i < reqs.size(); ++i) {
      const RequestOutput& o = r.outputs[i];
      ASSERT_TRUE(o.success) << o.error;
      EXPECT_EQ(o.session, reqs[i].session);
      EXPECT_GE(o.cached_tokens, 0);
      if (reqs[i].turn == 0) continue;
      const RequestOutput& prev = r.outputs[i - 1];
      EXPECT_GE(o.start_time, prev.start_time + prev.latency + 0.01 - 1e-9) << i;
      if (cache) {
        EXPECT_GT(o.cached_tokens, 0) << i;
      } else {
        EXPECT_EQ(o.cached_tokens, 0) << i;
      }
    }
  }
}

}  // namespace
}  // namespace servetune::loadgen
