// Sampler: greedy, seeded reproducibility, top-k / top-p / min-p support sets, penalties, banned tokens, logprobs,
// the empirical distribution of plain temperature sampling against the softmax, and non-finite logits refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "runtime/sampler.h"

namespace servetune {
namespace {

int32_t sample_once(const SamplingParams& p, std::vector<float> logits, uint64_t seed = 1) {
  Sampler s(p, seed, {});
  return s.sample(logits).token;
}

TEST(Sampler, GreedyPicksArgmax) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sample_once(p, {0.1f, 3.0f, -1.0f, 2.9f}), 1);
}

// A NaN or +inf logit is an error, greedy or sampled, with logprobs or penalties (the paths device sampling leaves to
// the host Sampler); -inf (a masked token) is ordinary.
TEST(Sampler, NonFiniteLogitsAreAnError) {
  for (float poison : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    for (float temperature : {0.0f, 0.8f}) {
      SamplingParams p;
      p.temperature = temperature;
      p.logprobs = 2;
      try {
        sample_once(p, {0.1f, poison, -1.0f, 2.9f});
        ADD_FAILURE() << "no error for logit " << poison << ", temperature " << temperature;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("NaN or +inf"), std::string::npos) << e.what();
      }
    }
  }
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(sample_once(greedy, {0.1f, -std::numeric_limits<float>::infinity(), 2.9f}), 2);
}

TEST(Sampler, SameSeedSameOutput) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<float> logits(100);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(static_cast<float>(i));
  Sampler a(p, 0, {}), b(p, 999, {});
  for (int i = 0; i < 50; ++i) {
    auto la = logits, lb = logits;
    EXPECT_EQ(a.sample(la).token, b.sample(lb).token);
  }
}

TEST(Sampler, TopKRestrictsSupport) {
  SamplingParams p;
  p.temperature = 5.0f;  // flat enough that every candidate appears
  p.top_k = 3;
  std::set<int32_t> seen;
  Sampler s(p, 7, {});
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> l = {1.0f, 5.0f, 4.0f, 0.0f, 3.0f, 2.0f};
    seen.insert(s.sample(l).token);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2, 4}));
}

TEST(Sampler, TopPAndMinP) {
  // probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1
  std::vector<float> base = {std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.125f)};
  SamplingParams p;
  p.top_p = 0.7f;  // needs the first two
  std::set<int32_t> seen;
  Sampler s(p, 3, {});
  for (int i = 0; i < 2000; ++i) {
    auto l = base;
    seen.insert(s.sample(l).token);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
  SamplingParams q;
  q.min_p = 0.3f;  // keeps p >= 0.15
  seen.clear();
  Sampler t(q, 3, {});
  for (int i = 0; i < 2000; ++i) {
    auto l = base;
    seen.insert(t.sample(l).token);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

// How often each token is drawn in n temperature samples from `logits`.
std::map<int32_t, int> draw_counts(const std::vector<float>& logits, float temperature, uint64_t seed, int n) {
  SamplingParams p;
  p.temperature = temperature;
  Sampler s(p, seed, {});
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    ++counts[s.sample(l).token];
  }
  return counts;
}

TEST(Sampler, TemperatureMatchesSoftmax) {
  std::vector<float> base = {0.0f, 1.0f, 2.0f};
  const int n = 40000;
  auto counts = draw_counts(base, 2.0f, 11, n);
  double z = 0;
  for (float v : base) z += std::exp(v / 2.0);
  for (int t = 0; t < 3; ++t) {
    const double expected = std::exp(base[static_cast<size_t>(t)] / 2.0) / z;
    EXPECT_NEAR(counts[t] / static_cast<double>(n), expected, 0.01) << t;
  }
}

// A vocabulary of several blocks with the mass on tokens spread over them, including the first and the last
// token and one past the last whole block: the draw walks block sums, then tokens.
TEST(Sampler, LargeVocabularyMatchesSoftmax) {
  std::vector<float> base(1000, -3.0f);
  const std::map<int32_t, float> heavy = {{0, 2.0f}, {255, 1.0f}, {256, 1.5f}, {700, 2.5f}, {770, 0.5f}, {999, 1.0f}};
  for (const auto& [t, l] : heavy) base[static_cast<size_t>(t)] = l;
  const int n = 40000;
  auto counts = draw_counts(base, 0.7f, 5, n);
  double z = 0;
  for (float v : base) z += std::exp(v / 0.7);
  double light = 0;
  for (const auto& [t, c] : counts) {
    if (!heavy.count(t)) light += c;
  }
  for (const auto& [t, l] : heavy) EXPECT_NEAR(counts[t] / static_cast<double>(n), std::exp(l / 0.7) / z, 0.01) << t;
  EXPECT_NEAR(light / n, 994 * std::exp(-3.0 / 0.7) / z, 0.01);
}

TEST(Sampler, PenaltiesAndBans) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.frequency_penalty = 1.0f;
  Sampler s(p, 0, {});
  s.accept(0);
  s.accept(0);
  std::vector<float> l = {3.0f, 1.5f, 0.0f};  // 3 - 2*1 = 1 < 1.5
  EXPECT_EQ(s.sample(l).token, 1);

  SamplingParams r;
  r.temperature = 0.0f;
  r.repetition_penalty = 2.0f;
  std::vector<int32_t> prompt = {0};
  Sampler rs(r, 0, prompt);
  std::vector<float> l2 = {3.0f, 2.0f};  // 3 / 2 = 1.5 < 2
  EXPECT_EQ(rs.sample(l2).token, 1);

  SamplingParams g;
  g.temperature = 0.0f;
  Sampler gs(g, 0, {});
  std::vector<float> l3 = {5.0f, 1.0f};
  std::vector<int32_t> banned = {0};
  EXPECT_EQ(gs.sample(l3, banned).token, 1);
}

TEST(Sampler, LogprobsAreOfTheRawDistribution) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 2;
  p.presence_penalty = 2.0f;
  Sampler s(p, 0, {});
  s.accept(0);
  std::vector<float> l = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SampleResult r = s.sample(l);
  EXPECT_EQ(r.token, 1);  // penalty moved the choice
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 0);
  EXPECT_NEAR(r.top[0].logprob, std::log(0.6f), 1e-5);
  EXPECT_NEAR(r.logprob, std::log(0.3f), 1e-5);
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p;
  p.max_tokens = 0;
  try {
    validate_sampling_params(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidRequest);
    EXPECT_NE(std::string(e.what()).find("max_tokens"), std::string::npos);
  }
  p.max_tokens = 1;
  p.top_p = 0.0f;
  EXPECT_THROW(validate_sampling_params(p), Error);
}

// The device sampler's inputs: device_row() hands out the uniform sample() would draw, so walking the plain
// temperature probabilities in id order with uniform * total gives the host's token for the same seed.
TEST(Sampler, DeviceRowDrawsTheUniformSampleWouldDraw) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 7;
  std::vector<float> logits(301);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 2.0f * std::sin(0.37f * static_cast<float>(i));
  Sampler host(p, 0, {}), device(p, 0, {});
  const float best = *std::max_element(logits.begin(), logits.end());
  int differing_draws = 0;
  double previous = -1.0;
  for (int draw = 0; draw < 200; ++draw) {
    auto copy = logits;
    const int32_t expected = host.sample(copy).token;
    const SampleRow row = device.device_row();
    EXPECT_EQ(row.temperature, 0.8f);
    ASSERT_GE(row.uniform, 0.0);
    ASSERT_LT(row.uniform, 1.0);
    differing_draws += row.uniform != previous;
    previous = row.uniform;
    double total = 0.0;
    for (float l : logits) total += std::exp((l - best) / 0.8);
    double r = row.uniform * total;
    int32_t token = -1;
    for (size_t i = 0; i < logits.size() && token < 0; ++i) {
      r -= std::exp((logits[i] - best) / 0.8);
      if (r < 0.0) token = static_cast<int32_t>(i);
    }
    EXPECT_EQ(token, expected) << "draw " << draw;
  }
  EXPECT_EQ(differing_draws, 200);
}

TEST(Sampler, DeviceRowOfGreedyDrawsNothingAndRefusalsNameTheSetting) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler s(greedy, 1, {});
  EXPECT_EQ(s.device_row().temperature, 0.0f);
  EXPECT_EQ(s.device_refusal({}), nullptr);
  const int32_t banned[] = {2};
  EXPECT_STREQ(s.device_refusal(banned), "tokens banned before min_tokens");
  SamplingParams lp;
  lp.logprobs = 0;
  EXPECT_STREQ(Sampler(lp, 1, {}).device_refusal({}), "logprobs");
  SamplingParams pen;
  pen.repetition_penalty = 1.1f;
  EXPECT_STREQ(Sampler(pen, 1, {}).device_refusal({}), "presence, frequency or repetition penalty");
}

}  // namespace
}  // namespace servetune
