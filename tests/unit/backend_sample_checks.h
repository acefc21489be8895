// Backend::sample against the host Sampler on random logits of awkward vocabulary sizes: with the same seed both
// draw the same uniforms, so greedy, temperature, top-k, top-p and min-p (alone and mixed, tied logits included)
// must pick the same token on every row; a NaN or +inf logit is an error naming its row. Instantiated per backend by
// test_cpu_sample.cpp and test_gpu_sample.cpp.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "runtime/sampler.h"

namespace servetune {

// Makes the backend under test, or returns nullptr with the reason to skip.
using SampleBackendFactory = std::unique_ptr<Backend> (*)(std::string& skip_reason);

// Normal logits of standard deviation `scale`; with `step` > 0 rounded to multiples of it (many exact ties).
inline std::vector<float> random_logits(size_t n, uint32_t seed, float scale, float step = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = step > 0.0f ? std::round(dist(rng) / step) * step : dist(rng);
  return v;
}

class BackendSample : public ::testing::TestWithParam<SampleBackendFactory> {
 protected:
  void SetUp() override {
    std::string skip_reason;
    backend_ = GetParam()(skip_reason);
    if (!backend_) GTEST_SKIP() << skip_reason;
  }

  // `rows` rows of `vocab` logits: the host Sampler's tokens and the backend's, from two Samplers of one seed.
  void expect_same_tokens(const SamplingParams& params, int64_t vocab, int64_t rows, float scale, float step = 0.0f) {
    const auto logits = random_logits(static_cast<size_t>(vocab * rows), static_cast<uint32_t>(vocab * 31 + rows), scale, step);
    Sampler host(params, 1234, {}), device(params, 1234, {});
    std::vector<int32_t> expected;
    std::vector<SampleRow> sample_rows;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      expected.push_back(host.sample(row).token);
      sample_rows.push_back(device.device_row());
    }
    auto buffer = backend_->allocate(logits.size() * sizeof(float));
    backend_->upload(*buffer, 0, logits.data(), logits.size() * sizeof(float));
    std::vector<int32_t> tokens(static_cast<size_t>(rows), -7);
    backend_->sample(static_cast<const float*>(buffer->data()), rows, vocab, sample_rows, tokens.data());
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(tokens[static_cast<size_t>(r)], expected[static_cast<size_t>(r)])
          << "vocab " << vocab << ", row " << r << ", temperature " << params.temperature << ", top_k " << params.top_k
          << ", top_p " << params.top_p << ", min_p " << params.min_p << ", uniform " << sample_rows[static_cast<size_t>(r)].uniform;
    }
  }

  std::unique_ptr<Backend> backend_;
};

constexpr int64_t kVocabs[] = {1, 3, 257, 4099, 32003, 151936};

inline SamplingParams params(float temperature, int32_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

TEST_P(BackendSample, GreedyIsTheArgmaxWithTheLowestIdAmongTies) {
  for (const int64_t vocab : kVocabs) expect_same_tokens(params(0.0f), vocab, 9, 2.0f);
  for (const int64_t vocab : kVocabs) expect_same_tokens(params(0.0f), vocab, 9, 1.0f, 1.0f);  // many tied maxima
}

TEST_P(BackendSample, TemperatureWalksTheVocabularyInIdOrder) {
  for (const int64_t vocab : kVocabs) {
    expect_same_tokens(params(1.0f), vocab, 24, 2.0f);
    expect_same_tokens(params(0.6f), vocab, 24, 3.0f);
  }
}

TEST_P(BackendSample, TopKTopPMinPAloneAndMixed) {
  for (const int64_t vocab : kVocabs) {
    expect_same_tokens(params(1.0f, 1), vocab, 8, 2.0f);
    expect_same_tokens(params(0.8f, 40), vocab, 24, 2.0f);
    expect_same_tokens(params(1.0f, static_cast<int32_t>(vocab) + 5), vocab, 8, 2.0f);  // more than the vocabulary
    expect_same_tokens(params(1.0f, 0, 0.9f), vocab, 24, 2.0f);
    expect_same_tokens(params(0.7f, 0, 1.0f, 0.05f), vocab, 24, 2.0f);
    expect_same_tokens(params(1.2f, 100, 0.8f, 0.02f), vocab, 24, 3.0f);
  }
}

TEST_P(BackendSample, FilteredCutsInsideGroupsOfTiedLogits) {
  for (const int64_t vocab : kVocabs) {
    expect_same_tokens(params(1.0f, 5), vocab, 16, 1.0f, 0.5f);
    expect_same_tokens(params(1.0f, 0, 0.5f), vocab, 16, 1.0f, 0.5f);
    expect_same_tokens(params(0.9f, 50, 0.7f, 0.1f), vocab, 16, 1.0f, 0.25f);
  }
}

TEST_P(BackendSample, RefusesSettingsOutsideTheSamplersRanges) {
  std::vector<float> logits(10, 0.0f);
  auto buffer = backend_->allocate(logits.size() * sizeof(float));
  backend_->upload(*buffer, 0, logits.data(), logits.size() * sizeof(float));
  SampleRow bad;
  bad.temperature = 1.0f;
  bad.top_p = 0.0f;
  int32_t token = -1;
  EXPECT_THROW(backend_->sample(static_cast<const float*>(buffer->data()), 1, 10, {&bad, 1}, &token), Error);
  const SampleRow rows[2] = {};
  EXPECT_THROW(backend_->sample(static_cast<const float*>(buffer->data()), 1, 10, rows, &token), Error);  // 2 rows for 1
}

// A NaN or +inf logit (one row of three, greedy and sampled) is an error naming the row, not a token: an argmax over
// NaNs still returns a plausible id. -inf (a masked token) is an ordinary logit.
TEST_P(BackendSample, NonFiniteLogitsAreAnErrorNamingTheRow) {
  Backend* backend = backend_.get();
  const int64_t vocab = 1000;
  for (float poison : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    for (float temperature : {0.0f, 0.8f}) {
      std::vector<float> logits = random_logits(3 * vocab, 5, 2.0f);
      logits[vocab + 777] = poison;
      logits[2 * vocab + 3] = -std::numeric_limits<float>::infinity();
      auto buffer = backend->allocate(logits.size() * sizeof(float));
      backend->upload(*buffer, 0, logits.data(), logits.size() * sizeof(float));
      SampleRow rows[3];
      for (SampleRow& r : rows) r.temperature = temperature, r.uniform = 0.5;
      int32_t tokens[3] = {};
      try {
        backend->sample(static_cast<const float*>(buffer->data()), 3, vocab, rows, tokens);
        ADD_FAILURE() << "no error for logit " << poison << ", temperature " << temperature;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("row 1 holds NaN or +inf"), std::string::npos) << e.what();
      }
      logits[vocab + 777] = 0.0f;  // the same rows without the poison sample normally
      backend->upload(*buffer, 0, logits.data(), logits.size() * sizeof(float));
      backend->sample(static_cast<const float*>(buffer->data()), 3, vocab, rows, tokens);
      for (int32_t t : tokens) EXPECT_TRUE(t >= 0 && t < vocab);
    }
  }
}

}  // namespace servetune
