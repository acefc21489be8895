// filtered_candidates (which gathers and ranks only the tokens a cut can keep) against its semantics written plainly:
// every candidate within e^-40 of the best, fully sorted by logit (ties by id), top-k, then top-p (relative to the
// top k's mass when top-k cuts, else to the vocabulary's as exp_scaled_blocks sums it), then min-p. Rows are normal,
// tied, nearly flat and peaked, at vocabulary sizes around the vector widths and sum blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/lane_sums.h"
#include "backend/cpu/sample_row.h"
#include "backend/cpu/vector_math.h"

namespace servetune::cpu {
namespace {

struct Kept {
  std::vector<int32_t> ids;
  std::vector<double> p;
};

Kept plain_filtered(const std::vector<float>& logits, const SampleRow& row) {
  const float best = *std::max_element(logits.begin(), logits.end());
  const float floor = best - 40.0f * row.temperature;
  const float inv_t = 1.0f / row.temperature;
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] >= floor) order.push_back(static_cast<int32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  });
  size_t keep = order.size();
  if (row.top_k > 0) keep = std::min(keep, static_cast<size_t>(row.top_k));
  std::vector<double> p(keep);
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp(static_cast<double>((logits[static_cast<size_t>(order[i])] - best) * inv_t));
  }
  double total = 0.0;
  if (row.top_k > 0 && static_cast<size_t>(row.top_k) < order.size()) {
    for (const double v : p) total += v;
  } else {
    std::vector<float> w(logits.size());
    std::vector<double> sums((logits.size() + kSumBlock - 1) / kSumBlock);
    exp_scaled_blocks(logits, best, inv_t, w, sums);
    for (const double s : sums) total += s;
  }
  size_t cut = keep;
  if (row.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / total;
      if (cum >= row.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  if (row.min_p > 0.0f) {
    size_t i = 1;
    while (i < cut && p[i] >= row.min_p * p[0]) ++i;
    cut = i;
  }
  order.resize(cut);
  p.resize(cut);
  return {order, p};
}

std::vector<float> make_row(size_t n, int shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(n);
  for (auto& v : row) {
    switch (shape) {
      case 0:
        v = 3.0f * normal(rng);
        break;  // broad
      case 1:
        v = std::round(2.0f * normal(rng));
        break;  // many exact ties
      case 2:
        v = 0.05f * normal(rng);
        break;  // nearly flat: top-p needs most of the vocabulary
      default:
        v = 2.0f * normal(rng) - 10.0f;
        break;  // peaked: a few tokens far above the rest
    }
  }
  if (shape == 3) {
    for (size_t i = 0; i < std::min<size_t>(n, 5); ++i) row[(i * 7919) % n] = 8.0f - static_cast<float>(i);
  }
  return row;
}

TEST(FilteredCandidates, MatchTheFullSortEverywhere) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<int32_t> order;
  std::vector<double> p;
  int checked = 0;
  for (size_t n : {1u, 3u, 17u, 257u, 4099u, 49152u}) {
    for (int shape = 0; shape < 4; ++shape) {
      for (int trial = 0; trial < 6; ++trial) {
        const std::vector<float> logits = make_row(n, shape, rng);
        SampleRow row;
        row.temperature = trial % 2 == 0 ? 1.0f : 0.6f;
        row.top_k = trial % 3 == 0 ? static_cast<int32_t>(1 + unit(rng) * 60) : trial == 5 ? 100000 : 0;
        row.top_p = trial % 3 != 2 ? 0.5f + 0.49f * unit(rng) : 1.0f;
        row.min_p = trial >= 2 ? (trial == 4 ? 1e-9f : 0.02f + 0.2f * unit(rng)) : 0.0f;
        if (row.top_k <= 0 && row.top_p >= 1.0f && row.min_p <= 0.0f) row.min_p = 0.05f;
        const Kept want = plain_filtered(logits, row);
        const size_t cut = filtered_candidates(logits, row, order, p);
        const std::string where = "n " + std::to_string(n) + " shape " + std::to_string(shape) + " trial " +
                                  std::to_string(trial) + " top_k " + std::to_string(row.top_k) + " top_p " +
                                  std::to_string(row.top_p) + " min_p " + std::to_string(row.min_p);
        ASSERT_EQ(cut, want.ids.size()) << where;
        for (size_t i = 0; i < cut; ++i) {
          ASSERT_EQ(order[i], want.ids[i]) << where << " rank " << i;
          ASSERT_EQ(p[i], want.p[i]) << where << " rank " << i;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 6 * 4 * 6);
}

// -0 and +0 compare equal, so they rank by id like any tie.
TEST(FilteredCandidates, SignedZerosTie) {
  std::vector<int32_t> order;
  std::vector<double> p;
  SampleRow row;
  row.temperature = 1.0f;
  row.top_k = 3;
  const std::vector<float> logits = {-1.0f, 0.0f, -0.0f, -0.0f, 0.0f, -2.0f};
  ASSERT_EQ(filtered_candidates(logits, row, order, p), 3u);
  EXPECT_EQ(order[0], 1);
  EXPECT_EQ(order[1], 2);
  EXPECT_EQ(order[2], 3);
}

// A best logit that is NaN (std::max_element's answer when the row starts with one) or infinite keeps that token
// alone; NaN logits elsewhere are never candidates.
TEST(FilteredCandidates, NonFiniteLogits) {
  std::vector<int32_t> order;
  std::vector<double> p;
  SampleRow row;
  row.temperature = 1.0f;
  row.top_p = 0.99f;
  for (const auto& [logits, first_best] : std::vector<std::pair<std::vector<float>, int32_t>>{
           {{NAN, 0.5f, 2.0f}, 0}, {{0.5f, INFINITY, 2.0f, INFINITY}, 1}}) {
    ASSERT_EQ(filtered_candidates(logits, row, order, p), 1u);
    EXPECT_EQ(order[0], first_best);
    EXPECT_EQ(p[0], 1.0);
  }
  const std::vector<float> logits = {2.0f, NAN, 2.0f};
  ASSERT_EQ(filtered_candidates(logits, row, order, p), 2u);
  EXPECT_EQ(order[0], 0);
  EXPECT_EQ(order[1], 2);
}

}  // namespace
}  // namespace servetune::cpu
