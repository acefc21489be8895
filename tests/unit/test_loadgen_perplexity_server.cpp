// The pieces of perplexity against a server: the top-K KL (position_logprobs.h) against the whole-vocabulary KL it
// bounds, vLLM-shaped prompt_logprobs responses parsed (and refused with the URL and the field named), the
// top-K log-probability file read back as written, and the /v1/completions URL made from what a user gives.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "loadgen/logprob_file.h"
#include "loadgen/perplexity_server.h"
#include "loadgen/position_logprobs.h"
#include "servetune/error.h"

namespace servetune::loadgen {
namespace {

// A random distribution over `vocab` tokens (peaked, as a language model's), as log-probabilities.
std::vector<float> random_row(std::mt19937& rng, size_t vocab) {
  std::normal_distribution<double> n(0.0, 3.0);
  std::vector<double> logits(vocab);
  for (double& l : logits) l = n(rng);
  double sum = 0.0;
  for (double l : logits) sum += std::exp(l);
  std::vector<float> out(vocab);
  for (size_t i = 0; i < vocab; ++i) out[i] = static_cast<float>(logits[i] - std::log(sum));
  return out;
}

// The top `k` of a whole row (plus the target), as a server reports them.
PositionLogprobs top_k(const std::vector<float>& row, size_t k, int32_t target) {
  PositionLogprobs p;
  p.target = target;
  p.target_logprob = row[static_cast<size_t>(target)];
  std::vector<int32_t> order(row.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)]; });
  order.resize(k);
  if (std::find(order.begin(), order.end(), target) == order.end()) order.push_back(target);
  std::sort(order.begin(), order.end());
  for (int32_t t : order) p.sparse.push_back({t, row[static_cast<size_t>(t)]});
  return p;
}

PositionLogprobs whole(const std::vector<float>& row, int32_t target) {
  PositionLogprobs p;
  p.target = target;
  p.target_logprob = row[static_cast<size_t>(target)];
  p.dense = row;
  return p;
}

TEST(TopKKl, ALowerBoundOfTheWholeRowKlThatIsExactWhenTheTopKIsEverything) {
  std::mt19937 rng(7);
  constexpr size_t kVocab = 64;
  for (int trial = 0; trial < 50; ++trial) {
    const auto a = random_row(rng, kVocab);
    auto b = a;
    std::normal_distribution<double> noise(0.0, trial % 2 ? 0.5 : 0.05);
    double sum = 0.0;
    for (float& x : b) x = static_cast<float>(x + noise(rng)), sum += std::exp(static_cast<double>(x));
    for (float& x : b) x = static_cast<float>(x - std::log(sum));
    const double full = kl_divergence(whole(a, 3), whole(b, 3));
    ASSERT_GT(full, 0.0);
    for (size_t k : {1u, 5u, 20u}) {
      const double sparse = kl_divergence(top_k(a, k, 3), top_k(b, k, 3));
      EXPECT_GE(sparse, 0.0);
      EXPECT_LE(sparse, full + 1e-6) << "k " << k;
      // One side whole, the other top-K: the shared tokens are the top-K side's.
      EXPECT_LE(kl_divergence(whole(a, 3), top_k(b, k, 3)), full + 1e-6);
      EXPECT_LE(kl_divergence(top_k(a, k, 3), whole(b, 3)), full + 1e-6);
    }
    EXPECT_NEAR(kl_divergence(top_k(a, kVocab, 3), top_k(b, kVocab, 3)), full, 1e-5);
    EXPECT_EQ(kl_divergence(top_k(a, 5, 3), top_k(a, 5, 3)), 0.0);  // a run against itself
  }
}

TEST(TopKKl, TheRestOfTheVocabularyIsOneOutcome) {
  // Base: token 0 holds 0.5, the rest 0.5; run: token 0 holds 0.25, the rest 0.75 (no other token shared).
  PositionLogprobs base, run;
  base.sparse = {{0, static_cast<float>(std::log(0.5))}, {1, static_cast<float>(std::log(0.3))}};
  run.sparse = {{0, static_cast<float>(std::log(0.25))}, {2, static_cast<float>(std::log(0.6))}};
  const double want = 0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75);
  EXPECT_NEAR(kl_divergence(base, run), want, 1e-6);
  EXPECT_EQ(base.top_token(), 0);
  EXPECT_EQ(run.top_token(), 2);
}

// A vLLM-shaped response body for `chunk`: every position's target plus token 0.
std::string response_for(const std::vector<int32_t>& chunk) {
  nlohmann::json list = nlohmann::json::array({nullptr});
  for (size_t p = 1; p < chunk.size(); ++p) {
    nlohmann::json e;
    e[std::to_string(chunk[p])] = {{"logprob", -0.5 - static_cast<double>(p)}, {"rank", 2}, {"decoded_token", "x"}};
    e["0"] = {{"logprob", -0.25}, {"rank", 1}, {"decoded_token", "<unk>"}};
    list.push_back(e);
  }
  return nlohmann::json({{"choices", {{{"index", 0}, {"text", "x"}, {"prompt_logprobs", list}}}}}).dump();
}

void expect_error(const std::function<void()>& fn, ErrorKind kind, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(PromptLogprobsResponse, ScoredPositionsAndEveryWayItCanBeWrong) {
  const std::string url = "http://h:1/v1/completions";
  const std::vector<int32_t> chunk = {1, 40, 41, 42, 43, 44};
  const auto pos = parse_prompt_logprobs(response_for(chunk), chunk, 3, url);
  ASSERT_EQ(pos.size(), 2u);  // positions 3 and 4 score tokens 43 and 44
  EXPECT_EQ(pos[0].target, 43);
  EXPECT_DOUBLE_EQ(pos[0].target_logprob, -4.5);
  ASSERT_EQ(pos[0].sparse.size(), 2u);
  EXPECT_EQ(pos[0].sparse[0].token, 0);  // by token id
  EXPECT_EQ(pos[0].top_token(), 0);
  EXPECT_EQ(pos[1].target, 44);

  nlohmann::json plain = {{"choices", {{{"index", 0}, {"text", "x"}, {"logprobs", nullptr}}}}};
  expect_error([&] { parse_prompt_logprobs(plain.dump(), chunk, 3, url); }, ErrorKind::kUnsupported,
               {url, "no 'prompt_logprobs'", "vLLM"});
  const std::vector<int32_t> longer = {1, 40, 41, 42, 43, 44, 45};
  expect_error([&] { parse_prompt_logprobs(response_for(chunk), longer, 3, url); }, ErrorKind::kFormat,
               {url, "one entry per prompt token (7), got 6 entries"});
  std::vector<int32_t> other = chunk;
  other[4] = 99;
  expect_error([&] { parse_prompt_logprobs(response_for(chunk), other, 3, url); }, ErrorKind::kFormat,
               {url, "prompt_logprobs[4] lacks the prompt token 99"});
  expect_error([&] { parse_prompt_logprobs("<html>", chunk, 3, url); }, ErrorKind::kFormat, {url, "not JSON"});
  auto bad_key = nlohmann::json::parse(response_for(chunk));
  bad_key["choices"][0]["prompt_logprobs"][4]["tok"] = {{"logprob", -1.0}};
  expect_error([&] { parse_prompt_logprobs(bad_key.dump(), chunk, 3, url); }, ErrorKind::kFormat, {"key 'tok' is not a token id"});
  expect_error([&] { make_server_scorer({url, "m", "", 0}, 512); }, ErrorKind::kUsage, {"at least 1"});
}

TEST(PromptLogprobsResponse, CompletionsUrl) {
  EXPECT_EQ(completions_url("http://h:8000"), "http://h:8000/v1/completions");
  EXPECT_EQ(completions_url("http://h:8000/"), "http://h:8000/v1/completions");
  EXPECT_EQ(completions_url("http://h:8000/v1"), "http://h:8000/v1/completions");
  EXPECT_EQ(completions_url("http://h:8000/v1/completions"), "http://h:8000/v1/completions");
}

TEST(LogprobFile, TopKRowsReadBackAsWrittenAndAShapeMismatchIsRefused) {
  const auto path = (std::filesystem::temp_directory_path() / ("servetune_topk_" + std::to_string(::getpid()))).string();
  const LogprobShape shape{4, 512, {{1, 5, 6, 7}, {1, 8, 9, 10}}};
  std::vector<PositionLogprobs> written;
  {
    LogprobWriter w(path, shape, false);
    for (const auto& c : shape.chunks) {
      PositionLogprobs p;
      p.target = c[3];
      p.target_logprob = -1.0 / 3.0;  // f64 in the file: perplexity against it is exact
      p.sparse = {{0, -0.5f}, {c[3], -1.0f / 3.0f}};
      w.write(p);
      written.push_back(p);
    }
    w.finish();
  }
  LogprobReader r(path, shape, true);  // a whole-row run may compare against top-K rows
  for (const auto& want : written) {
    const PositionLogprobs got = r.next(want.target);
    EXPECT_FALSE(got.is_dense());
    EXPECT_EQ(got.target_logprob, want.target_logprob);
    ASSERT_EQ(got.sparse.size(), want.sparse.size());
    EXPECT_EQ(got.sparse[1].token, want.sparse[1].token);
    EXPECT_EQ(got.sparse[1].logprob, want.sparse[1].logprob);
  }
  expect_error([&] { r.next(0); }, ErrorKind::kUsage, {path, "ends early"});
  LogprobShape other = shape;
  other.chunks[1][2] = 77;
  expect_error([&] { LogprobReader(path, other, false); }, ErrorKind::kUsage, {path, "scored other tokens"});
  other = shape;
  other.vocab = 1000;  // top-K rows match by token id: another vocabulary size is no mismatch
  EXPECT_NO_THROW(LogprobReader(path, other, false));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace servetune::loadgen
