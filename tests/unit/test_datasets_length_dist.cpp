// Length distributions of synthetic multi-turn sessions (vLLM's multi-turn config names): each distribution's sample
// statistics against its closed form for a fixed seed (tolerances of about 4 standard errors), caps, determinism, and
// the parse errors that name the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>

#include "datasets/length_dist.h"
#include "servetune/error.h"

namespace servetune::datasets {
namespace {

constexpr int kDraws = 20000;

std::vector<int64_t> draws(const std::string& text, uint64_t seed = 7, int n = kDraws) {
  const LengthDist d = parse_length_dist(text, "--test");
  Rng rng(seed);
  std::vector<int64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(d.sample(rng));
  return v;
}

double mean(const std::vector<int64_t>& v) {
  double s = 0;
  for (int64_t x : v) s += static_cast<double>(x);
  return s / static_cast<double>(v.size());
}

double variance(const std::vector<int64_t>& v) {
  const double m = mean(v);
  double s = 0;
  for (int64_t x : v) s += (static_cast<double>(x) - m) * (static_cast<double>(x) - m);
  return s / static_cast<double>(v.size() - 1);
}

double share(const std::vector<int64_t>& v, int64_t k) {
  return static_cast<double>(std::count(v.begin(), v.end(), k)) / static_cast<double>(v.size());
}

TEST(LengthDist, UniformCoversItsIntegerRangeEvenly) {
  const auto v = draws("uniform:min=120,max=160");
  EXPECT_EQ(*std::min_element(v.begin(), v.end()), 120);
  EXPECT_EQ(*std::max_element(v.begin(), v.end()), 160);
  EXPECT_NEAR(mean(v), 140.0, 0.35);               // sd 11.8 / sqrt(20000) = 0.08
  EXPECT_NEAR(variance(v), (41.0 * 41.0 - 1) / 12, 6.0);  // discrete uniform: 140
}

TEST(LengthDist, ConstantDrawsNoRandomNumbers) {
  const LengthDist d = parse_length_dist("constant:value=500", "--test");
  Rng a(1), b(1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(d.sample(a), 500);
  EXPECT_EQ(a.next_u64(), b.next_u64());  // a constant leaves the stream where it was: plain options keep their draws
  EXPECT_EQ(parse_length_dist("12", "--test").text(), "constant:value=12");
}

TEST(LengthDist, ZipfMatchesItsProbabilitiesAndCap) {
  // P(k) = k^-2 / zeta(2), zeta(2) = pi^2 / 6.
  const double zeta2 = std::numbers::pi * std::numbers::pi / 6.0;
  const auto v = draws("zipf:alpha=2");
  EXPECT_NEAR(share(v, 1), 1.0 / zeta2, 0.014);  // sd 0.0035
  EXPECT_NEAR(share(v, 2), 0.25 / zeta2, 0.011);
  EXPECT_NEAR(share(v, 3), 1.0 / 9.0 / zeta2, 0.008);
  // Capped at 20: the tail P(k >= 20) lands on 20.
  const auto capped = draws("zipf:alpha=2,max=20");
  double below = 0;
  for (int k = 1; k < 20; ++k) below += 1.0 / (k * k) / zeta2;
  EXPECT_EQ(*std::max_element(capped.begin(), capped.end()), 20);
  EXPECT_NEAR(share(capped, 20), 1.0 - below, 0.005);  // 0.031, sd 0.0012
}

TEST(LengthDist, PoissonMeanAndVarianceForSmallAndLargeMeans) {
  for (const double lambda : {4.0, 15.0, 200.0}) {  // multiplication below 10, PTRS above
    SCOPED_TRACE(lambda);
    const auto v = draws("poisson:alpha=" + std::to_string(lambda));
    EXPECT_NEAR(mean(v), lambda, 4.0 * std::sqrt(lambda / kDraws));
    EXPECT_NEAR(variance(v), lambda, 0.06 * lambda);
    const auto k = static_cast<int64_t>(lambda);  // the mode's probability e^-l l^k / k!
    EXPECT_NEAR(share(v, k), std::exp(-lambda + static_cast<double>(k) * std::log(lambda) - std::lgamma(lambda + 1.0)),
                0.01);
  }
  const auto capped = draws("poisson:alpha=50,max=45");
  EXPECT_EQ(*std::max_element(capped.begin(), capped.end()), 45);
}

TEST(LengthDist, LognormalByAverageOrByMeanAndSigma) {
  // average 200, median_ratio 0.85 (vLLM's default): mean 200, median 170.
  auto v = draws("lognormal:average=200");
  EXPECT_NEAR(mean(v), 200.0, 4.0);  // sd 124 / sqrt(20000) = 0.9
  std::sort(v.begin(), v.end());
  EXPECT_NEAR(static_cast<double>(v[v.size() / 2]), 170.0, 3.0);
  // mean 5, sigma 0.5 of the underlying normal: median e^5 = 148.4, mean e^5.125 = 168.2.
  auto w = draws("lognormal:mean=5,sigma=0.5");
  EXPECT_NEAR(mean(w), std::exp(5.125), 2.5);
  std::sort(w.begin(), w.end());
  EXPECT_NEAR(static_cast<double>(w[w.size() / 2]), std::exp(5.0), 2.5);
  const auto capped = draws("lognormal:average=1000,max=1500");
  EXPECT_EQ(*std::max_element(capped.begin(), capped.end()), 1500);
  EXPECT_GT(share(capped, 1500), 0.05);
}

TEST(LengthDist, SameSeedSameDrawsAndTheTextReadsBack) {
  for (const char* text : {"uniform:min=1,max=9", "zipf:alpha=1.5,max=100", "poisson:alpha=30", "lognormal:average=50,median_ratio=0.5",
                           "lognormal:mean=3,sigma=1,max=90"}) {
    SCOPED_TRACE(text);
    EXPECT_EQ(draws(text, 3, 50), draws(text, 3, 50));
    EXPECT_NE(draws(text, 3, 50), draws(text, 4, 50));
    const LengthDist d = parse_length_dist(text, "--test");
    EXPECT_EQ(parse_length_dist(d.text(), "--test").text(), d.text());
    EXPECT_EQ(d.text(), text);
  }
}

TEST(LengthDist, BadTextNamesTheFlagAndTheProblem) {
  const std::map<std::string, std::string> cases = {
      {"weibull:k=2", "unknown distribution 'weibull'"},
      {"uniform:min=5", "uniform needs max"},
      {"uniform:min=9,max=5", "min must be <= max"},
      {"uniform:min=1.5,max=5", "min must be an integer"},
      {"zipf:alpha=1", "alpha must be > 1"},
      {"zipf:alpha=2,beta=3", "'beta' is not a parameter of zipf"},
      {"poisson:alpha=-1", "poisson's alpha"},
      {"poisson", "not a distribution"},  // no parameters and not a number
      {"lognormal:average=100,mean=3", "not both"},
      {"lognormal:average=100,median_ratio=1.5", "median_ratio must be in (0, 1)"},
      {"lognormal:mean=3", "lognormal needs sigma"},
      {"constant:value=abc", "'value=abc' is not KEY=NUMBER"},
      {"constant:value=3,value=4", "'value' given twice"},
      {"zipf:alpha=2,max=0", "max must be an integer >= 1"},
  };
  for (const auto& [text, why] : cases) {
    try {
      parse_length_dist(text, "--multi-turn-turns-dist");
      ADD_FAILURE() << text << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("--multi-turn-turns-dist: ", 0), 0u) << m;
      EXPECT_NE(m.find(why), std::string::npos) << text << ": " << m;
    }
  }
}

}  // namespace
}  // namespace servetune::datasets
