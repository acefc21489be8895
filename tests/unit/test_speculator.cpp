// N-gram proposals and lossless draft verification, model-free: greedy verification is the argmax, and a
// chi-square test over many seeds shows that speculative sampling — deterministic (n-gram) drafts, and drafts
// drawn from a draft model's distribution q verified with min(1, p/q) — draws from the same distribution as plain
// sampling (with temperature, top-k and penalties), and that it catches a deliberately broken acceptance rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <random>

#include "chi_square.h"
#include "runtime/draft_speculator.h"
#include "runtime/speculator.h"

namespace servetune {
namespace {

TEST(NgramSpeculator, ProposesWhatFollowedTheLongestMostRecentMatch) {
  NgramSpeculator spec(1, 3);
  std::vector<int32_t> out;
  spec.propose(std::vector<int32_t>{1, 2, 3, 4, 5, 1, 2, 3}, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 5, 1, 2}));
  spec.propose(std::vector<int32_t>{1, 2, 3, 4, 5, 1, 2, 3}, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{4}));
  // Two earlier occurrences of the suffix: the most recent one wins.
  spec.propose(std::vector<int32_t>{7, 8, 1, 9, 7, 8, 2, 9, 7, 8}, 2, out);
  EXPECT_EQ(out, (std::vector<int32_t>{2, 9}));
  // The longer n-gram takes precedence over a more recent shorter one.
  spec.propose(std::vector<int32_t>{5, 6, 10, 0, 6, 11, 0, 5, 6}, 1, out);
  EXPECT_EQ(out, (std::vector<int32_t>{10}));
  // Fewer tokens than asked when the match is near the end; none without a match or room.
  spec.propose(std::vector<int32_t>{3, 4, 3}, 5, out);
  EXPECT_EQ(out, (std::vector<int32_t>{4, 3}));
  spec.propose(std::vector<int32_t>{1, 2, 3}, 5, out);
  EXPECT_TRUE(out.empty());
  spec.propose(std::vector<int32_t>{1, 1, 1}, 0, out);
  EXPECT_TRUE(out.empty());
  NgramSpeculator long_only(3, 3);
  long_only.propose(std::vector<int32_t>{1, 2, 9, 1, 2}, 3, out);
  EXPECT_TRUE(out.empty());
}

constexpr int32_t kVocab = 6;

// A fake model: the next-token logits depend on the last two tokens.
std::vector<float> fake_logits(const std::vector<int32_t>& ctx) {
  const int32_t a = ctx[ctx.size() - 1], b = ctx.size() > 1 ? ctx[ctx.size() - 2] : 0;
  std::vector<float> l(kVocab);
  for (int32_t t = 0; t < kVocab; ++t) l[static_cast<size_t>(t)] = 2.0f * std::sin(static_cast<float>(a * 7 + b * 3 + t * 5) * 1.3f);
  l[static_cast<size_t>((a + 1) % kVocab)] += 1.0f;  // make continuing the pattern likely, so drafts get accepted
  return l;
}

TEST(VerifyDraft, GreedyAcceptsExactlyTheArgmaxPrefix) {
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<int32_t> prompt = {0, 1, 2};
  Sampler sampler(p, 1, prompt);
  std::vector<int32_t> ctx = prompt;
  // Greedy continuation of the fake model, then a draft that agrees on two tokens and then differs.
  std::vector<int32_t> greedy = ctx;
  for (int i = 0; i < 4; ++i) {
    auto l = fake_logits(greedy);
    greedy.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
  }
  const std::vector<int32_t> draft = {greedy[3], greedy[4], static_cast<int32_t>((greedy[5] + 1) % kVocab)};
  std::vector<std::vector<float>> rows;
  for (size_t j = 0; j <= draft.size(); ++j) {
    std::vector<int32_t> c = ctx;
    c.insert(c.end(), draft.begin(), draft.begin() + static_cast<long>(j));
    rows.push_back(fake_logits(c));
  }
  std::vector<int32_t> emitted;
  const int64_t accepted = verify_draft(
      sampler, draft, [&](size_t j) { return std::span<float>(rows[j]); }, [] { return std::vector<int32_t>{}; },
      [&](SampleResult& r) {
        emitted.push_back(r.token);
        return false;
      });
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(emitted, (std::vector<int32_t>{greedy[3], greedy[4], greedy[5]}));

  // A finish (stop) on the first accepted token truncates the burst.
  emitted.clear();
  Sampler s2(p, 1, prompt);
  verify_draft(
      s2, draft, [&](size_t j) { return std::span<float>(rows[j]); }, [] { return std::vector<int32_t>{}; },
      [&](SampleResult& r) {
        emitted.push_back(r.token);
        return true;
      });
  EXPECT_EQ(emitted.size(), 1u);
}

constexpr int kOutputLen = 5;
const std::vector<int32_t> kPrompt = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1};

int encode(const std::vector<int32_t>& out) {
  int code = 0;
  for (int32_t t : out) code = code * kVocab + t;
  return code;
}

int plain_run(const SamplingParams& p, uint64_t seed) {
  Sampler sampler(p, seed, kPrompt);
  std::vector<int32_t> ctx = kPrompt, out;
  while (static_cast<int>(out.size()) < kOutputLen) {
    auto l = fake_logits(ctx);
    const int32_t t = sampler.sample(l).token;
    sampler.accept(t);
    ctx.push_back(t);
    out.push_back(t);
  }
  return encode(out);
}

int speculative_run(const SamplingParams& p, uint64_t seed, bool broken, int64_t& drafted, int64_t& accepted) {
  Sampler sampler(p, seed, kPrompt);
  if (broken) sampler.break_verification_for_test();
  NgramSpeculator spec(1, 3);
  std::vector<int32_t> ctx = kPrompt, out, draft;
  while (static_cast<int>(out.size()) < kOutputLen) {
    spec.propose(ctx, std::min<int64_t>(3, kOutputLen - static_cast<int64_t>(out.size()) - 1), draft);
    std::vector<std::vector<float>> rows;
    for (size_t j = 0; j <= draft.size(); ++j) {
      std::vector<int32_t> c = ctx;
      c.insert(c.end(), draft.begin(), draft.begin() + static_cast<long>(j));
      rows.push_back(fake_logits(c));
    }
    drafted += static_cast<int64_t>(draft.size());
    accepted += verify_draft(
        sampler, draft, [&](size_t j) { return std::span<float>(rows[j]); }, [] { return std::vector<int32_t>{}; },
        [&](SampleResult& r) {
          ctx.push_back(r.token);
          out.push_back(r.token);
          return static_cast<int>(out.size()) >= kOutputLen;
        });
  }
  return encode(out);
}

// A fake draft model: the target's fake logits bent by a context-dependent term, so q differs from p.
std::vector<float> fake_draft_logits(const std::vector<int32_t>& ctx) {
  std::vector<float> l = fake_logits(ctx);
  for (int32_t t = 0; t < kVocab; ++t) l[static_cast<size_t>(t)] += 1.2f * std::cos(static_cast<float>(t * 2 + ctx.back()) * 2.1f);
  return l;
}

// Speculation with drafts drawn from the fake draft model's q (as DraftModelSpeculator draws them), verified with q.
int draft_model_run(const SamplingParams& p, uint64_t seed, bool broken, int64_t& drafted, int64_t& accepted) {
  Sampler sampler(p, seed, kPrompt);
  if (broken) sampler.break_verification_for_test();
  std::mt19937_64 draft_rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<int32_t> ctx = kPrompt, out, draft;
  std::vector<float> q, probs;
  while (static_cast<int>(out.size()) < kOutputLen) {
    const int64_t k = std::min<int64_t>(3, kOutputLen - static_cast<int64_t>(out.size()) - 1);
    draft.clear();
    probs.clear();
    std::vector<int32_t> c = ctx;
    for (int64_t j = 0; j < k; ++j) {
      draft_distribution(fake_draft_logits(c), p, q);
      const int32_t d = std::discrete_distribution<int32_t>(q.begin(), q.end())(draft_rng);
      draft.push_back(d);
      probs.insert(probs.end(), q.begin(), q.end());
      c.push_back(d);
    }
    std::vector<std::vector<float>> rows;
    for (size_t j = 0; j <= draft.size(); ++j) {
      std::vector<int32_t> r = ctx;
      r.insert(r.end(), draft.begin(), draft.begin() + static_cast<long>(j));
      rows.push_back(fake_logits(r));
    }
    drafted += static_cast<int64_t>(draft.size());
    accepted += verify_draft(
        sampler, draft, [&](size_t j) { return std::span<float>(rows[j]); }, [] { return std::vector<int32_t>{}; },
        [&](SampleResult& r) {
          ctx.push_back(r.token);
          out.push_back(r.token);
          return static_cast<int>(out.size()) >= kOutputLen;
        },
        probs);
  }
  return encode(out);
}

// A draft tree (as DraftHeadSpeculator builds one, deterministic): the root's three most likely tokens under the fake
// draft model, and each of those's two most likely children; verified in one go with verify_tree.
std::vector<int32_t> top_tokens(const std::vector<float>& l, size_t k) {
  std::vector<int32_t> ids(l.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)]; });
  ids.resize(k);
  return ids;
}

int tree_run(const SamplingParams& p, uint64_t seed, bool broken, int64_t& drafted, int64_t& accepted) {
  Sampler sampler(p, seed, kPrompt);
  if (broken) sampler.break_verification_for_test();
  std::vector<int32_t> ctx = kPrompt, out;
  while (static_cast<int>(out.size()) < kOutputLen) {
    std::vector<int32_t> draft, parents;
    for (const int32_t child : top_tokens(fake_draft_logits(ctx), 3)) {
      const auto at = static_cast<int32_t>(draft.size());
      draft.push_back(child);
      parents.push_back(-1);
      std::vector<int32_t> c = ctx;
      c.push_back(child);
      for (const int32_t grandchild : top_tokens(fake_draft_logits(c), 2)) {
        draft.push_back(grandchild);
        parents.push_back(at);
      }
    }
    std::vector<std::vector<float>> rows = {fake_logits(ctx)};  // row 1 + i: after node i's path
    for (size_t i = 0; i < draft.size(); ++i) {
      std::vector<int32_t> c = ctx;
      if (parents[i] >= 0) c.push_back(draft[static_cast<size_t>(parents[i])]);
      c.push_back(draft[i]);
      rows.push_back(fake_logits(c));
    }
    drafted += 2;  // the tree's depth: what a chain of its length could have accepted
    accepted += static_cast<int64_t>(verify_tree(
        sampler, draft, parents, [&](size_t j) { return std::span<float>(rows[j]); }, [] { return std::vector<int32_t>{}; },
        [&](SampleResult& r) {
          ctx.push_back(r.token);
          out.push_back(r.token);
          return static_cast<int>(out.size()) >= kOutputLen;
        }).size());
  }
  return encode(out);
}

// Two-sample chi-square over the joint distribution of the whole output (tests/chi_square.h).
std::pair<double, double> chi_square(const std::map<int, int64_t>& a, const std::map<int, int64_t>& b) {
  std::map<int, std::pair<int64_t, int64_t>> cells;
  for (const auto& [k, v] : a) cells[k].first += v;
  for (const auto& [k, v] : b) cells[k].second += v;
  const testing::ChiSquare c = testing::two_sample_chi_square(cells);
  return {c.stat, c.critical};
}

struct Outcome {
  double stat, critical;
  double acceptance;
};

enum class Drafts { kNgram, kDraftModel, kTree };

Outcome compare(const SamplingParams& p, bool broken, Drafts drafts = Drafts::kNgram) {
  constexpr int kRuns = 40000;
  std::map<int, int64_t> plain, spec;
  int64_t drafted = 0, accepted = 0;
  const auto run = drafts == Drafts::kTree ? &tree_run : drafts == Drafts::kDraftModel ? &draft_model_run : &speculative_run;
  for (int i = 0; i < kRuns; ++i) {
    ++plain[plain_run(p, 1000003ull * static_cast<uint64_t>(i) + 1)];
    const uint64_t seed = 2000003ull * static_cast<uint64_t>(i) + 7;
    ++spec[run(p, seed, broken, drafted, accepted)];
  }
  auto [stat, critical] = chi_square(plain, spec);
  std::printf("%s%s rule, temperature %.1f top_k %d: chi-square %.1f (critical at p=1e-6: %.1f), acceptance %.2f\n",
              drafts == Drafts::kTree ? "tree drafts, " : drafts == Drafts::kDraftModel ? "draft-model drafts, " : "",
              broken ? "broken" : "correct", static_cast<double>(p.temperature), p.top_k, stat, critical,
              static_cast<double>(accepted) / static_cast<double>(std::max<int64_t>(1, drafted)));
  return {stat, critical, static_cast<double>(accepted) / static_cast<double>(std::max<int64_t>(1, drafted))};
}

std::vector<SamplingParams> param_sets() {
  SamplingParams plain_t;
  plain_t.temperature = 1.0f;
  SamplingParams filtered;
  filtered.temperature = 0.7f;
  filtered.top_k = 4;
  filtered.top_p = 0.95f;
  filtered.frequency_penalty = 0.4f;
  return {plain_t, filtered};
}

TEST(VerifyDraft, SpeculativeSamplingKeepsTheTargetDistribution) {
  for (const SamplingParams& p : param_sets()) {
    const Outcome o = compare(p, false);
    EXPECT_LT(o.stat, o.critical) << "temperature " << p.temperature << " top_k " << p.top_k;
    EXPECT_GT(o.acceptance, 0.1) << "the test needs drafts that get accepted";
  }
}

TEST(VerifyDraft, ChiSquareCatchesABrokenAcceptanceRule) {
  // Re-drawing from p including the rejected draft over-weights drafts; the same test must notice.
  for (const SamplingParams& p : param_sets()) {
    const Outcome o = compare(p, true);
    EXPECT_GT(o.stat, o.critical) << "temperature " << p.temperature << " top_k " << p.top_k;
  }
}

TEST(VerifyDraft, DraftModelSamplingKeepsTheTargetDistribution) {
  for (const SamplingParams& p : param_sets()) {
    const Outcome o = compare(p, false, Drafts::kDraftModel);
    EXPECT_LT(o.stat, o.critical) << "temperature " << p.temperature << " top_k " << p.top_k;
    EXPECT_GT(o.acceptance, 0.2) << "the test needs drafts that get accepted";
    EXPECT_LT(o.acceptance, 0.95) << "the test needs drafts that get rejected";
  }
}

TEST(VerifyDraft, ChiSquareCatchesABrokenDraftModelAcceptanceRule) {
  // After a rejection, drawing from p instead of the residual max(0, p - q) over-weights the draft's tokens.
  for (const SamplingParams& p : param_sets()) {
    const Outcome o = compare(p, true, Drafts::kDraftModel);
    EXPECT_GT(o.stat, o.critical) << "temperature " << p.temperature << " top_k " << p.top_k;
  }
}

// Siblings tried in order, each with its probability under p minus the siblings rejected before it (recursive
// rejection sampling with one-hot draft distributions), keep p.
TEST(VerifyTree, SiblingRejectionSamplingKeepsTheTargetDistribution) {
  for (const SamplingParams& p : param_sets()) {
    const Outcome o = compare(p, false, Drafts::kTree);
    EXPECT_LT(o.stat, o.critical) << "temperature " << p.temperature << " top_k " << p.top_k;
    EXPECT_GT(o.acceptance, 0.2) << "the test needs drafts that get accepted";
  }
}

TEST(VerifyTree, ChiSquareCatchesABrokenSiblingRule) {
  // Trying each sibling against the full p (not p without the rejected ones) over-weights the later siblings.
  for (const SamplingParams& p : param_sets()) {
    const Outcome o = compare(p, true, Drafts::kTree);
    EXPECT_GT(o.stat, o.critical) << "temperature " << p.temperature << " top_k " << p.top_k;
  }
}

// Greedy: the walk follows the target's argmax through the tree and stops where no child has it.
TEST(VerifyTree, GreedyFollowsTheArgmaxPath) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  Sampler sampler(greedy, 1, kPrompt);
  std::vector<int32_t> ctx = kPrompt;
  const auto argmax = [](const std::vector<float>& l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };
  const int32_t a = argmax(fake_logits(ctx));
  std::vector<int32_t> c = ctx;
  c.push_back(a);
  const int32_t b = argmax(fake_logits(c));
  // Node 0: a wrong child of the root; node 1: a (right); node 2: a wrong child of 1; node 3: b (right, a leaf).
  const std::vector<int32_t> draft = {(a + 1) % kVocab, a, (b + 2) % kVocab, b}, parents = {-1, -1, 1, 1};
  std::vector<std::vector<float>> rows = {fake_logits(ctx)};
  for (size_t i = 0; i < draft.size(); ++i) {
    std::vector<int32_t> r = ctx;
    if (parents[i] >= 0) r.push_back(draft[static_cast<size_t>(parents[i])]);
    r.push_back(draft[i]);
    rows.push_back(fake_logits(r));
  }
  std::vector<int32_t> emitted;
  const std::vector<int32_t> path = verify_tree(
      sampler, draft, parents, [&](size_t j) { return std::span<float>(rows[j]); }, [] { return std::vector<int32_t>{}; },
      [&](SampleResult& r) {
        emitted.push_back(r.token);
        return false;
      });
  EXPECT_EQ(path, (std::vector<int32_t>{1, 3}));
  c.push_back(b);
  EXPECT_EQ(emitted, (std::vector<int32_t>{a, b, argmax(fake_logits(c))}));  // the leaf's bonus token last
}

TEST(DraftDistribution, IsTheSamplersFilteredTemperedSoftmax) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0.5f;
  std::vector<float> q;
  draft_distribution(logits, p, q);
  double total = 0.0, norm = 0.0;
  for (float l : logits) norm += std::exp((l - 3.0) / 0.5);
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(q[i], std::exp((logits[i] - 3.0) / 0.5) / norm, 1e-6);
    total += q[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  p.top_k = 2;  // tokens 4 and 0 only
  draft_distribution(logits, p, q);
  EXPECT_EQ(q[1], 0.0f);
  EXPECT_EQ(q[3], 0.0f);
  EXPECT_NEAR(q[4] + q[0], 1.0, 1e-6);
  EXPECT_NEAR(q[4] / q[0], std::exp(2.0), 1e-4);
  p.top_k = 0;
  p.min_p = 0.5f;  // keeps tokens within a factor 2 of the best in tempered probability: token 4 only
  draft_distribution(logits, p, q);
  EXPECT_FLOAT_EQ(q[4], 1.0f);
}

}  // namespace
}  // namespace servetune
