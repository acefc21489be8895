// The engine against llama.cpp: greedy continuations identical and top-5 log-probabilities close, for stories260K
// and SmolLM2-135M-Instruct Q4_1, one request at a time and all at once (continuous batching).
//
// SmolLM2 Q4_1 is numerically chaotic: int8 activation quantization turns ulp-level differences into ~0.1 shifts of
// log-probabilities, and llama.cpp disagrees with itself by that much. scripts/measure_llamacpp_noise.py measures it
// (llama-cpp-python 0.3.36): against the golden (F32 KV, flash attention off), llama.cpp's defaults and its
// flash-attention path move first-step log-probabilities by up to 0.20 (top-1) and 0.35 (ranks 2-5), and their greedy
// output leaves the golden in 9-10 of 12 prompts, at golden top-1/top-2 margins up to 0.26. The SmolLM2 tolerances
// sit just above that noise floor: greedy compared up to the first golden margin below 0.3, top-1 log-probability
// within 0.2, ranks 2-5 within 0.4. stories260K (F32 weights, no activation quantization) is held to identity
// and 1e-3 over all 64 positions.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "golden_cases.h"
#include "servetune/engine.h"
#include "test_paths.h"

namespace servetune {
namespace {

constexpr float kNearTieMargin = 0.3f;
constexpr float kTop1LogprobTol = 0.2f;
constexpr float kTailLogprobTol = 0.4f;

struct Output {
  std::vector<int32_t> ids;
  std::vector<SampleResult> logprobs;
  FinishReason finish = FinishReason::kNone;
};

Output collect(RequestStream& stream) {
  Output o;
  while (auto e = stream.next()) {
    o.ids.insert(o.ids.end(), e->token_ids.begin(), e->token_ids.end());
    for (auto& lp : e->logprobs) o.logprobs.push_back(lp);
    if (e->finish != FinishReason::kNone) {
      o.finish = e->finish;
      EXPECT_NE(o.finish, FinishReason::kError) << e->error;
      break;
    }
  }
  return o;
}

Request greedy_request(const testing::GoldenCase& c) {
  Request r;
  r.prompt_ids = c.prompt_ids;
  r.sampling.temperature = 0.0f;
  r.sampling.max_tokens = 64;
  r.sampling.logprobs = 5;
  return r;
}

// Compares the top-5 of the first `positions` generated positions: rank 1 to `top1_tol`, ranks 2-5 to `tail_tol`.
void expect_logprobs_close(const testing::GoldenCase& c, const Output& o, float top1_tol, float tail_tol, size_t positions) {
  for (size_t i = 0; i < std::min({positions, o.logprobs.size(), c.top5.size()}); ++i) {
    if (i > 0 && o.ids[i - 1] != c.output_ids[i - 1]) break;  // contexts differ from here on
    const auto& ours = o.logprobs[i].top;
    ASSERT_EQ(ours.size(), 5u);
    for (size_t rank = 0; rank < c.top5[i].size(); ++rank) {
      const auto& [token, expected] = c.top5[i][rank];
      const float tol = rank == 0 ? top1_tol : tail_tol;
      auto it = std::find_if(ours.begin(), ours.end(), [&](const TokenLogprob& t) { return t.token == token; });
      if (it == ours.end()) {
        // Tokens near the 5th place can swap in and out; then it must be below our 5th within the tolerance.
        EXPECT_LT(expected, ours.back().logprob + tol) << "token " << token << " missing from our top-5 at " << i;
        continue;
      }
      EXPECT_NEAR(it->logprob, expected, tol) << "token " << token << " (rank " << rank + 1 << ") at position " << i
                                              << " of '" << c.prompt << "'";
    }
  }
}

// Greedy outputs must agree up to the first position whose reference top-1/top-2 margin is below `near_tie`
// (0: everywhere).
void expect_same_greedy(const testing::GoldenCase& c, const std::vector<int32_t>& ours, float near_tie, const char* what) {
  size_t compare = c.output_ids.size();
  for (size_t i = 0; i < c.top5.size(); ++i) {
    if (c.top5[i][0].second - c.top5[i][1].second < near_tie) {
      compare = i + 1;  // the near-tie position itself is not required to match
      break;
    }
  }
  const size_t n = std::min(compare - (compare < c.output_ids.size() ? 1 : 0), c.output_ids.size());
  ASSERT_GE(ours.size(), std::min(n, c.output_ids.size())) << what << " output too short for '" << c.prompt << "'";
  std::vector<int32_t> a(ours.begin(), ours.begin() + static_cast<long>(std::min(n, ours.size())));
  std::vector<int32_t> b(c.output_ids.begin(), c.output_ids.begin() + static_cast<long>(n));
  EXPECT_EQ(a, b) << what << " prompt: '" << c.prompt << "' (compared " << n << " of " << c.output_ids.size() << " tokens)";
  if (near_tie == 0.0f) {
    EXPECT_EQ(ours, c.output_ids) << what << " prompt: '" << c.prompt << "'";
  }
}

struct GoldenTolerance {
  float near_tie;   // greedy compared up to the first reference margin below this (0: the whole output)
  float top1;       // log-probability tolerance of the reference's top token
  float tail;       // ... of ranks 2-5
  size_t logprob_positions;
};

void run_model(const std::string& model, const std::string& golden, const GoldenTolerance& tol) {
  SERVETUNE_REQUIRE_FILE(model);
  auto cases = testing::load_golden_cases(testing::data_path(golden));
  ASSERT_GE(cases.size(), 8u);
  EngineConfig cfg;
  cfg.model = model;
  cfg.threads = 2;
  cfg.max_total_tokens = 16384;
  Engine engine(cfg);

  // One at a time.
  size_t identical = 0;
  for (const auto& c : cases) {
    auto stream = engine.submit(greedy_request(c));
    Output o = collect(*stream);
    expect_same_greedy(c, o.ids, tol.near_tie, "alone");
    expect_logprobs_close(c, o, tol.top1, tol.tail, tol.logprob_positions);
    identical += o.ids == c.output_ids;
  }
  std::printf("%zu of %zu greedy continuations identical to llama.cpp over their whole length\n", identical, cases.size());
  // All at once: continuous batching must not change any output beyond the same bound.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& c : cases) streams.push_back(engine.submit(greedy_request(c)));
  for (size_t i = 0; i < cases.size(); ++i) {
    Output o = collect(*streams[i]);
    expect_same_greedy(cases[i], o.ids, tol.near_tie, "batched");
  }
  auto stats = engine.stats();
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.waiting, 0);
}

TEST(EngineGolden, Stories260KMatchesLlamaCpp) {
  run_model(testing::stories_path(), "model/stories260K.greedy.json", {0.0f, 1e-3f, 1e-3f, 64});
}

TEST(EngineGolden, SmolLM2MatchesLlamaCpp) {
  run_model(testing::smollm2_path(), "model/smollm2.greedy.json", {kNearTieMargin, kTop1LogprobTol, kTailLogprobTol, 1});
}

}  // namespace
}  // namespace servetune
