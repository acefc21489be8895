// MoE routing (backend/moe_routing.h) against a plain full-sort reference over many configurations (softmax / sigmoid,
// groups, bias, renormalisation, scaling, tie-heavy logits), plus hand-built cases: ties go to lower expert and group
// ids, the bias moves the choice but never the weights, dropped groups stay dropped, renormalised weights sum to the
// scaling, the DeepSeek-V2/V3 shapes, and validation errors that name the offending key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "backend/moe_routing.h"

namespace servetune {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// The routing rule written as plainly as possible: every score, full sorts, an eligibility mask.
Routed reference_route(const MoeRouting& r, const float* logits, const float* bias) {
  const int64_t n = r.n_experts;
  std::vector<float> scores(static_cast<size_t>(n));
  if (r.scoring == MoeScoring::kSoftmax) {
    const float max = *std::max_element(logits, logits + n);
    float sum = 0.0f;
    for (int64_t e = 0; e < n; ++e) sum += (scores[e] = std::exp(logits[e] - max));
    for (auto& s : scores) s /= sum;
  } else {
    for (int64_t e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  }
  std::vector<float> selection(scores);
  if (bias) {
    for (int64_t e = 0; e < n; ++e) selection[e] += bias[e];
  }
  std::vector<bool> eligible(static_cast<size_t>(n), true);
  if (r.n_group > 1) {
    const int64_t per_group = n / r.n_group;
    std::vector<std::pair<float, int64_t>> group_rank;  // (group score, group id)
    for (int64_t g = 0; g < r.n_group; ++g) {
      std::vector<float> members(selection.begin() + g * per_group, selection.begin() + (g + 1) * per_group);
      std::sort(members.begin(), members.end(), std::greater<float>());
      group_rank.emplace_back(r.group_score == MoeGroupScore::kMax ? members[0] : members[0] + members[1], g);
    }
    std::sort(group_rank.begin(), group_rank.end(),
              [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    std::fill(eligible.begin(), eligible.end(), false);
    for (int64_t i = 0; i < r.topk_group; ++i) {
      for (int64_t e = 0; e < per_group; ++e) eligible[group_rank[i].second * per_group + e] = true;
    }
  }
  std::vector<int32_t> order;
  for (int32_t e = 0; e < n; ++e) {
    if (eligible[e]) order.push_back(e);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return selection[a] > selection[b] || (selection[a] == selection[b] && a < b);
  });
  Routed out;
  out.ids.assign(order.begin(), order.begin() + r.top_k);
  float sum = 0.0f;
  for (int32_t id : out.ids) {
    out.weights.push_back(scores[id]);
    sum += scores[id];
  }
  for (auto& w : out.weights) {
    if (r.renormalize) w /= sum + 1e-20f;
    w *= r.scaling;
  }
  return out;
}

Routed route(const MoeRouting& r, const std::vector<float>& logits, const std::vector<float>* bias = nullptr) {
  const int64_t n = static_cast<int64_t>(logits.size()) / r.n_experts;
  Routed out{std::vector<int32_t>(static_cast<size_t>(n * r.top_k)), std::vector<float>(static_cast<size_t>(n * r.top_k))};
  route_tokens(r, logits.data(), bias ? bias->data() : nullptr, n, out.ids.data(), out.weights.data());
  return out;
}

std::string describe(const MoeRouting& r, bool bias) {
  return "experts " + std::to_string(r.n_experts) + " top_k " + std::to_string(r.top_k) +
         (r.scoring == MoeScoring::kSoftmax ? " softmax" : " sigmoid") + " groups " + std::to_string(r.n_group) + "/" +
         std::to_string(r.topk_group) + (r.group_score == MoeGroupScore::kMax ? " max" : " top-two") +
         (bias ? " bias" : "") + (r.renormalize ? " renormalised" : "") + " scaling " + std::to_string(r.scaling);
}

// Routes `tokens` rows of `logits` and checks every row against the reference.
void expect_matches_reference(const MoeRouting& r, const std::vector<float>& logits, const std::vector<float>* bias) {
  SCOPED_TRACE(describe(r, bias != nullptr));
  const Routed got = route(r, logits, bias);
  const int64_t tokens = static_cast<int64_t>(logits.size()) / r.n_experts;
  for (int64_t t = 0; t < tokens; ++t) {
    const Routed want = reference_route(r, logits.data() + t * r.n_experts, bias ? bias->data() : nullptr);
    for (int64_t k = 0; k < r.top_k; ++k) {
      ASSERT_EQ(got.ids[t * r.top_k + k], want.ids[k]) << "token " << t << " slot " << k;
      ASSERT_FLOAT_EQ(got.weights[t * r.top_k + k], want.weights[k]) << "token " << t << " slot " << k;
    }
  }
}

// Normal logits, or coarse ones (a few distinct values) so that scores, selection keys and group scores tie often.
std::vector<float> random_logits(std::mt19937& rng, int64_t count, bool coarse) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> level(-2, 2);
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = coarse ? 0.5f * static_cast<float>(level(rng)) : normal(rng);
  return v;
}

std::vector<float> random_bias(std::mt19937& rng, int64_t count, bool coarse) {
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::bernoulli_distribution half;
  std::vector<float> v(static_cast<size_t>(count));
  for (auto& x : v) x = coarse ? (half(rng) ? 0.25f : 0.0f) : normal(rng);
  return v;
}

struct Shape {
  int64_t n_experts, top_k, n_group, topk_group;
};

TEST(MoeRouting, MatchesTheFullSortReferenceAcrossConfigurations) {
  const Shape shapes[] = {
      {8, 1, 1, 1},   {8, 2, 1, 1},   {8, 8, 1, 1},    {60, 4, 1, 1},  {64, 6, 1, 1},  {8, 2, 4, 2},
      {8, 4, 4, 2},   {16, 3, 4, 1},  {16, 4, 4, 4},   {60, 4, 4, 2},  {64, 6, 8, 3},  {64, 8, 8, 1},
      {128, 8, 8, 4}, {160, 6, 8, 3}, {256, 8, 8, 4},  {256, 1, 16, 1}, {12, 5, 6, 3},  {64, 40, 1, 1},
      {256, 48, 8, 4},
  };
  std::mt19937 rng(7);
  const int64_t tokens = 24;
  for (const Shape& s : shapes) {
    for (MoeScoring scoring : {MoeScoring::kSoftmax, MoeScoring::kSigmoid}) {
      for (MoeGroupScore group_score : {MoeGroupScore::kMax, MoeGroupScore::kTopTwoSum}) {
        if (s.n_group == 1 && group_score == MoeGroupScore::kTopTwoSum) continue;  // no groups: nothing to score
        for (bool renormalize : {false, true}) {
          for (float scaling : {1.0f, 2.5f}) {
            for (bool coarse : {false, true}) {
              MoeRouting r{s.n_experts, s.top_k, scoring, s.n_group, s.topk_group, group_score, renormalize, scaling};
              const std::vector<float> logits = random_logits(rng, tokens * s.n_experts, coarse);
              const std::vector<float> bias = random_bias(rng, s.n_experts, coarse);
              expect_matches_reference(r, logits, nullptr);
              expect_matches_reference(r, logits, &bias);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

TEST(MoeRouting, EqualLogitsPickTheLowestExpertIds) {
  MoeRouting r{8, 3, MoeScoring::kSoftmax};
  const Routed plain = route(r, std::vector<float>(8, 0.5f));
  EXPECT_EQ(plain.ids, (std::vector<int32_t>{0, 1, 2}));
  for (float w : plain.weights) EXPECT_FLOAT_EQ(w, 1.0f / 8.0f);
  r.renormalize = true;
  const Routed renormalized = route(r, std::vector<float>(8, 0.5f));
  EXPECT_EQ(renormalized.ids, (std::vector<int32_t>{0, 1, 2}));
  for (float w : renormalized.weights) EXPECT_FLOAT_EQ(w, 1.0f / 3.0f);
  // Ties below a clear winner still go to the lower ids.
  const Routed mixed = route(r, {0.0f, 1.0f, 0.0f, 0.0f, 1.0f, 0.0f, 3.0f, 0.0f});
  EXPECT_EQ(mixed.ids, (std::vector<int32_t>{6, 1, 4}));
}

TEST(MoeRouting, EqualGroupScoresKeepTheLowerGroup) {
  // Four groups of two; groups 1, 2 and 3 tie on their top-two sum, only two groups are kept: groups 1 and 2.
  const MoeRouting r{8, 2, MoeScoring::kSigmoid, 4, 2, MoeGroupScore::kTopTwoSum};
  const Routed got = route(r, {-3.0f, -3.0f, 1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f});
  EXPECT_EQ(got.ids, (std::vector<int32_t>{2, 5})) << "expert 6 scores as high, but its group 3 loses the tie";
}

TEST(MoeRouting, BiasMovesTheChoiceButNotTheWeights) {
  const auto sigmoid = [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
  MoeRouting r{4, 2, MoeScoring::kSigmoid};
  const std::vector<float> logits{2.0f, 1.0f, 0.0f, -1.0f};
  EXPECT_EQ(route(r, logits).ids, (std::vector<int32_t>{0, 1}));
  const std::vector<float> bias{0.0f, 0.0f, 1.0f, 0.0f};  // lifts expert 2 (score 0.5) above both others
  const Routed biased = route(r, logits, &bias);
  EXPECT_EQ(biased.ids, (std::vector<int32_t>{2, 0}));
  EXPECT_FLOAT_EQ(biased.weights[0], sigmoid(0.0f)) << "the unbiased score, not 0.5 + 1";
  EXPECT_FLOAT_EQ(biased.weights[1], sigmoid(2.0f));
  r.renormalize = true;
  r.scaling = 2.0f;
  const Routed renormalized = route(r, logits, &bias);
  const float sum = sigmoid(0.0f) + sigmoid(2.0f);
  EXPECT_FLOAT_EQ(renormalized.weights[0], sigmoid(0.0f) / sum * 2.0f);
  EXPECT_FLOAT_EQ(renormalized.weights[1], sigmoid(2.0f) / sum * 2.0f);
}

TEST(MoeRouting, RenormalizedWeightsSumToTheScaling) {
  std::mt19937 rng(11);
  for (MoeScoring scoring : {MoeScoring::kSoftmax, MoeScoring::kSigmoid}) {
    for (float scaling : {1.0f, 2.5f, 16.0f}) {
      const MoeRouting r{64, 6, scoring, 8, 3, MoeGroupScore::kTopTwoSum, true, scaling};
      const Routed got = route(r, random_logits(rng, 50 * 64, false));
      for (int64_t t = 0; t < 50; ++t) {
        float sum = 0.0f;
        for (int64_t k = 0; k < r.top_k; ++k) sum += got.weights[t * r.top_k + k];
        EXPECT_NEAR(sum, scaling, 1e-6f * scaling) << "token " << t;
      }
    }
  }
}

TEST(MoeRouting, AnExpertOfADroppedGroupIsNeverChosen) {
  // Top-two group score: expert 0 has by far the best score, but its group's second best is tiny, so group 1 wins.
  const MoeRouting two{8, 2, MoeScoring::kSigmoid, 2, 1, MoeGroupScore::kTopTwoSum};
  EXPECT_EQ(route(two, {6.0f, -6.0f, -6.0f, -6.0f, 1.0f, 1.0f, 1.0f, 1.0f}).ids, (std::vector<int32_t>{4, 5}));
  // Max group score: group 0 holds the best expert and is the only group kept, so its weak second expert is chosen
  // over experts 2 and 3 of group 1, which both score higher.
  const MoeRouting max{6, 2, MoeScoring::kSoftmax, 3, 1, MoeGroupScore::kMax};
  EXPECT_EQ(route(max, {3.0f, -5.0f, 2.5f, 2.4f, 0.0f, 0.0f}).ids, (std::vector<int32_t>{0, 1}));
}

TEST(MoeRouting, DroppedGroupsStayDroppedWhenTheKeptScoresAreNegative) {
  // With sigmoid scores and a negative bias every selection score is below 0. DeepSeek's reference masks dropped
  // groups with -inf, so the kept group's experts are chosen; a 0.0 mask (HF transformers) would pick 2 and 3.
  const MoeRouting r{4, 2, MoeScoring::kSigmoid, 2, 1, MoeGroupScore::kTopTwoSum};
  const std::vector<float> bias{-2.0f, -2.0f, -3.0f, -3.0f};
  const Routed got = route(r, std::vector<float>(4, 0.0f), &bias);
  EXPECT_EQ(got.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_FLOAT_EQ(got.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(got.weights[1], 0.5f);
}

TEST(MoeRouting, MixtralTopTwoIsASoftmaxOverTheChosenLogits) {
  const MoeRouting r{8, 2, MoeScoring::kSoftmax, 1, 1, MoeGroupScore::kMax, true};
  std::mt19937 rng(3);
  const std::vector<float> logits = random_logits(rng, 100 * 8, false);
  const Routed got = route(r, logits);
  for (int64_t t = 0; t < 100; ++t) {
    const float first = logits[t * 8 + got.ids[t * 2]], second = logits[t * 8 + got.ids[t * 2 + 1]];
    EXPECT_GE(first, second);
    EXPECT_NEAR(got.weights[t * 2], 1.0f / (1.0f + std::exp(second - first)), 1e-6f);
    EXPECT_NEAR(got.weights[t * 2 + 1], 1.0f / (1.0f + std::exp(first - second)), 1e-6f);
  }
}

TEST(MoeRouting, SoftmaxStaysFiniteForLargeLogits) {
  const MoeRouting r{4, 2, MoeScoring::kSoftmax};
  const Routed got = route(r, {1000.0f, 999.0f, -1000.0f, 0.0f});
  EXPECT_EQ(got.ids, (std::vector<int32_t>{0, 1}));
  const float e = std::exp(-1.0f);
  EXPECT_FLOAT_EQ(got.weights[0], 1.0f / (1.0f + e));
  EXPECT_FLOAT_EQ(got.weights[1], e / (1.0f + e));
}

TEST(MoeRouting, NanScoresRankLast) {
  const MoeRouting r{4, 2, MoeScoring::kSigmoid};
  const Routed got = route(r, {std::numeric_limits<float>::quiet_NaN(), 1.0f, 2.0f, 0.0f});
  EXPECT_EQ(got.ids, (std::vector<int32_t>{2, 1}));
}

TEST(MoeRouting, DeepSeekV3Shape) {
  // 256 experts in 8 groups of 32, 4 groups kept, top-8, sigmoid + e_score_correction_bias, renormalised, x2.5.
  const MoeRouting r{256, 8, MoeScoring::kSigmoid, 8, 4, MoeGroupScore::kTopTwoSum, true, 2.5f};
  std::mt19937 rng(2025);
  const int64_t tokens = 300;
  const std::vector<float> logits = random_logits(rng, tokens * 256, false);
  const std::vector<float> bias = random_bias(rng, 256, false);
  expect_matches_reference(r, logits, &bias);
  const Routed got = route(r, logits, &bias);
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* ids = got.ids.data() + t * 8;
    std::set<int32_t> experts, groups;
    float sum = 0.0f;
    for (int64_t k = 0; k < 8; ++k) {
      experts.insert(ids[k]);
      groups.insert(ids[k] / 32);
      sum += got.weights[t * 8 + k];
      const float score = 1.0f / (1.0f + std::exp(-logits[t * 256 + ids[k]]));
      if (k > 0) {
        const float prev = 1.0f / (1.0f + std::exp(-logits[t * 256 + ids[k - 1]]));
        EXPECT_GE(prev + bias[ids[k - 1]], score + bias[ids[k]]) << "descending selection score, token " << t;
      }
    }
    EXPECT_EQ(experts.size(), 8u) << "token " << t;
    EXPECT_LE(groups.size(), 4u) << "token " << t;
    EXPECT_NEAR(sum, 2.5f, 1e-5f) << "token " << t;
  }
}

TEST(MoeRouting, DeepSeekV2ShapeScalesTheUnrenormalisedScores) {
  // DeepSeek-V2: 160 experts in 8 groups (max score), 3 kept, top-6, softmax, norm_topk_prob false, so the weights
  // are the softmax scores times routed_scaling_factor 16.
  const MoeRouting r{160, 6, MoeScoring::kSoftmax, 8, 3, MoeGroupScore::kMax, false, 16.0f};
  std::mt19937 rng(5);
  const std::vector<float> logits = random_logits(rng, 40 * 160, false);
  expect_matches_reference(r, logits, nullptr);
}

TEST(MoeRouting, ZeroTokensWriteNothing) {
  const MoeRouting r{8, 2, MoeScoring::kSoftmax};
  EXPECT_NO_THROW(route_tokens(r, nullptr, nullptr, 0, nullptr, nullptr));
}

void expect_rejected(const MoeRouting& r, const std::string& key) {
  try {
    validate_moe_routing(r, "config.json");
    ADD_FAILURE() << "accepted a routing with a bad " << key;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << "expected '" << key << "' in: " << e.what();
  }
}

TEST(MoeRouting, ValidationNamesTheKey) {
  const MoeRouting v3{256, 8, MoeScoring::kSigmoid, 8, 4, MoeGroupScore::kTopTwoSum, true, 2.5f};
  EXPECT_NO_THROW(validate_moe_routing(v3, "config.json"));
  auto with = [&](auto change) {
    MoeRouting r = v3;
    change(r);
    return r;
  };
  expect_rejected(with([](MoeRouting& r) { r.n_experts = 0; }), "n_experts");
  expect_rejected(with([](MoeRouting& r) { r.n_experts = int64_t{1} << 32; }), "n_experts");
  expect_rejected(with([](MoeRouting& r) { r.top_k = 0; }), "num_experts_per_tok");
  expect_rejected(with([](MoeRouting& r) { r.n_group = 1; r.top_k = 257; }), "top_k");
  expect_rejected(with([](MoeRouting& r) { r.n_group = 0; }), "n_group");
  expect_rejected(with([](MoeRouting& r) { r.n_group = 7; }), "n_group");
  expect_rejected(with([](MoeRouting& r) { r.topk_group = -1; }), "topk_group");
  expect_rejected(with([](MoeRouting& r) { r.topk_group = 9; }), "topk_group");
  expect_rejected(with([](MoeRouting& r) { r.topk_group = 1; r.top_k = 33; }), "topk_group");
  expect_rejected(with([](MoeRouting& r) { r.n_group = 256; r.topk_group = 8; }), "n_group");
  expect_rejected(with([](MoeRouting& r) { r.scaling = 0.0f; }), "routed_scaling_factor");
  expect_rejected(with([](MoeRouting& r) { r.scaling = std::numeric_limits<float>::infinity(); }), "scaling");
  expect_rejected(with([](MoeRouting& r) { r.scaling = std::numeric_limits<float>::quiet_NaN(); }), "scaling");
  // One expert per group is fine for a max group score.
  EXPECT_NO_THROW(validate_moe_routing(with([](MoeRouting& r) {
                                         r.n_group = 256;
                                         r.topk_group = 8;
                                         r.group_score = MoeGroupScore::kMax;
                                       }),
                                       "config.json"));
  // route_tokens checks too, rather than reading out of bounds.
  const MoeRouting bad = with([](MoeRouting& r) { r.top_k = 300; });
  std::vector<float> logits(256, 0.0f), weights(300);
  std::vector<int32_t> ids(300);
  EXPECT_THROW(route_tokens(bad, logits.data(), nullptr, 1, ids.data(), weights.data()), Error);
}

}  // namespace
}  // namespace servetune
