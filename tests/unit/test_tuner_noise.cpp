// Noise over repeats: Student-t quantiles against published tables, Welch's test against mpmath's numbers,
// the edge cases (one repeat, no spread), and a staged sweep that keeps its incumbent when a challenger's lead is
// within the repeats' noise but promotes one beyond it.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>

#include "tuner/noise.h"
#include "tuner/strategy.h"

namespace servetune::tuner {
namespace {

TEST(TunerNoise, StudentTQuantilesMatchTables) {
  // Two-sided 95% (p = 0.975) and 99% (p = 0.995) critical values of the t distribution.
  EXPECT_NEAR(student_t_quantile(0.975, 1), 12.7062, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 2), 4.3027, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.7764, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 10), 2.2281, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.995, 3), 5.8409, 1e-4);
  EXPECT_NEAR(student_t_quantile(0.975, 1e6), 1.95996, 1e-4);  // the normal limit
  EXPECT_NEAR(student_t_quantile(0.025, 4), -2.7764, 1e-4);
  EXPECT_NEAR(student_t_cdf(0.0, 7), 0.5, 1e-12);
}

TEST(TunerNoise, MeanIntervalNeedsTwoSamples) {
  EXPECT_FALSE(mean_interval({5.0}));
  const auto i = mean_interval({10.0, 12.0, 14.0});  // mean 12, sd 2, se 2/sqrt(3), t(0.975, 2) = 4.3027
  ASSERT_TRUE(i);
  EXPECT_DOUBLE_EQ(i->mean, 12.0);
  EXPECT_NEAR(i->high - i->mean, 4.3027 * 2.0 / std::sqrt(3.0), 1e-3);
  EXPECT_NEAR(i->mean - i->low, i->high - i->mean, 1e-12);
}

TEST(TunerNoise, WelchMatchesAnIndependentComputation) {
  // Reference: t, Welch's dof and the p-value from mpmath 1.3.0's regularized incomplete beta (betainc), the 97.5%
  // quantile from its findroot: t = 2.2255, dof = 24.52, p = 0.035485, interval [+0.844%, +22.08%].
  const std::vector<double> a = {19.8, 20.4, 19.6, 17.8, 18.5, 18.9, 18.3, 18.9, 19.5, 22.0};
  const std::vector<double> b = {28.2, 26.6, 20.1, 23.3, 25.2, 22.1, 17.7, 27.6, 20.6, 13.7,
                                 23.2, 17.5, 20.6, 18.0, 23.9, 21.6, 24.3, 20.4, 23.9, 13.3};
  const auto d = compare_means(a, b);
  ASSERT_TRUE(d);
  EXPECT_NEAR(d->p_value, 0.0354845308300103, 1e-9);
  EXPECT_NEAR(d->change, (21.59 - 19.37) / 19.37, 1e-9);
  EXPECT_NEAR(d->low, 0.00844302270931562, 1e-8);
  EXPECT_NEAR(d->high, 0.220777421276229, 1e-8);
  EXPECT_TRUE(d->significant());
  // Reversed: the same test, the change negative.
  const auto r = compare_means(b, a);
  ASSERT_TRUE(r);
  EXPECT_NEAR(r->p_value, d->p_value, 1e-12);
  EXPECT_LT(r->high, 0.0);
}

TEST(TunerNoise, EdgeCases) {
  EXPECT_FALSE(compare_means({1.0}, {1.0, 2.0}));
  EXPECT_FALSE(compare_means({0.0, 0.0}, {1.0, 2.0}));
  const auto same = compare_means({5.0, 5.0}, {5.0, 5.0});
  ASSERT_TRUE(same);
  EXPECT_FALSE(same->significant());
  const auto exact = compare_means({5.0, 5.0}, {6.0, 6.0});  // no spread: any difference is exact
  ASSERT_TRUE(exact);
  EXPECT_TRUE(exact->significant());
  EXPECT_NEAR(exact->change, 0.2, 1e-12);
  // Overlapping noisy repeats: not significant.
  const auto noisy = compare_means({100.0, 120.0, 90.0}, {110.0, 95.0, 125.0});
  ASSERT_TRUE(noisy);
  EXPECT_FALSE(noisy->significant());
  EXPECT_GT(noisy->p_value, 0.5);
}

TEST(TunerNoise, PredictionAllowance) {
  EXPECT_FALSE(noise_allowance({1.0}, 3));
  EXPECT_NEAR(*noise_allowance({100.0, 100.5, 99.5}, 3), 9.9248 * 0.5 * std::sqrt(2.0 / 3.0), 1e-3);
  EXPECT_DOUBLE_EQ(*noise_allowance({7.0, 7.0}, 1), 0.0);
}

nlohmann::ordered_json record(const Candidate& c, int repeat, double tps, const std::string& workload = "w") {
  nlohmann::ordered_json r;
  r["schema"] = "servetune.record.v1";
  r["candidate"] = {{"id", c.id}, {"label", c.label}, {"settings", c.settings}};
  r["workload"] = {{"name", workload}, {"group", workload}};
  r["repeat"] = repeat;
  r["metrics"] = {{"total_token_throughput", tps}, {"completed", 10}};
  return r;
}

TEST(TunerNoise, StagedPromotesOnlyBeyondNoise) {
  const SweepSpec s = parse_sweep(parse_spec_text(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 16, 32], schedule_policy: [fcfs, lpm]}
strategy: {kind: staged, stages: [{name: batch, dims: [max_running_requests]}, {name: policy, dims: [schedule_policy]}]}
workloads: [{name: w, dataset: random}]
repeat: 3
)", "test.yaml"));
  SearchSpace space(s);
  const Candidate m8 = space.find({{"max_running_requests", 8}}), m16 = space.find({{"max_running_requests", 16}}),
                  m32 = space.find({{"max_running_requests", 32}});
  const Candidate m8l = space.find({{"max_running_requests", 8}, {"schedule_policy", "lpm"}});
  std::vector<nlohmann::ordered_json> recs;
  // m16's median is highest, but its repeats overlap m8's: within noise. m32 is lower.
  for (int r = 0; r < 3; ++r) {
    recs.push_back(record(m8, r, std::vector<double>{100, 120, 90}[r]));
    recs.push_back(record(m16, r, std::vector<double>{125, 95, 118}[r]));
    recs.push_back(record(m32, r, std::vector<double>{80, 82, 81}[r]));
  }
  auto st = Strategy::make(s, space);
  ASSERT_TRUE(st->next(ResultsTable{}));
  const auto b2 = st->next(ResultsTable::build(recs));
  ASSERT_TRUE(b2);
  EXPECT_EQ(b2->trials.front().candidate.id, m8.id);  // the policy stage varies around the kept incumbent
  EXPECT_EQ(st->stages()[0].winner, m8.id);
  EXPECT_EQ(st->stages()[0].not_promoted, m16.id);
  // lpm beats fcfs beyond noise: promoted.
  for (int r = 0; r < 3; ++r) recs.push_back(record(m8l, r, std::vector<double>{150, 152, 149}[r]));
  EXPECT_FALSE(st->next(ResultsTable::build(recs)));
  EXPECT_EQ(st->stages()[1].winner, m8l.id);
  EXPECT_TRUE(st->stages()[1].not_promoted.empty());
}

// Screening keeps its fraction (here 1 of 4), and with repeats also every candidate the last kept one does not beat
// beyond noise: m16 trails m8 within noise and goes on; m32 and m64 trail beyond it and stop.
TEST(TunerNoise, HalvingKeepsWhatScreeningCannotTellApart) {
  const SweepSpec s = parse_sweep(parse_spec_text(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 16, 32, 64]}
strategy: {kind: halving, screen_prompts: [4], keep: 0.25}
workloads: [{name: w, dataset: random, num_prompts: 16}]
repeat: 3
)", "test.yaml"));
  SearchSpace space(s);
  const Candidate m8 = space.find({{"max_running_requests", 8}}), m16 = space.find({{"max_running_requests", 16}}),
                  m32 = space.find({{"max_running_requests", 32}}), m64 = space.find({{"max_running_requests", 64}});
  std::vector<nlohmann::ordered_json> recs;
  for (int r = 0; r < 3; ++r) {
    recs.push_back(record(m8, r, std::vector<double>{120, 100, 130}[r], "w@screen4"));
    recs.push_back(record(m16, r, std::vector<double>{115, 125, 95}[r], "w@screen4"));
    recs.push_back(record(m32, r, std::vector<double>{60, 61, 59}[r], "w@screen4"));
    recs.push_back(record(m64, r, std::vector<double>{40, 41, 39}[r], "w@screen4"));
  }
  auto st = Strategy::make(s, space);
  ASSERT_TRUE(st->next(ResultsTable{}));
  const auto final_batch = st->next(ResultsTable::build(recs));
  ASSERT_TRUE(final_batch);
  EXPECT_EQ(st->stages()[0].kept, 2u);
  std::vector<std::string> finalists;
  for (const auto& t : final_batch->trials) finalists.push_back(t.candidate.id);
  EXPECT_NE(std::find(finalists.begin(), finalists.end(), m16.id), finalists.end());
  EXPECT_EQ(std::find(finalists.begin(), finalists.end(), m32.id), finalists.end());
  EXPECT_EQ(std::find(finalists.begin(), finalists.end(), m64.id), finalists.end());
}

}  // namespace
}  // namespace servetune::tuner
