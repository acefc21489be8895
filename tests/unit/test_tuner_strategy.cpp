// Strategies over synthetic results: grid covers the space; staged keeps each stage's winner and varies the next
// stage around it; halving screens everyone and sends the best fraction (and the baseline) to the full workloads;
// replaying a strategy over stored results gives the same batches (what --resume and `report` rely on).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>

#include "servetune/error.h"
#include "test_paths.h"
#include "tuner/strategy.h"

namespace servetune::tuner {
namespace {

SweepSpec parse_strategy_spec(const std::string& text) { return parse_sweep(parse_spec_text(text, "test.yaml")); }

nlohmann::ordered_json record(const Candidate& c, const std::string& workload, double tps, double tpot = 10.0) {
  nlohmann::ordered_json r;
  r["schema"] = "servetune.record.v1";
  r["candidate"] = {{"id", c.id}, {"label", c.label}, {"settings", c.settings}};
  r["workload"] = {{"name", workload}, {"group", workload}};
  r["repeat"] = 0;
  r["metrics"] = {{"total_token_throughput", tps}, {"mean_tpot_ms", tpot}, {"completed", 10}};
  return r;
}

std::vector<std::string> ids(const Batch& b) {
  std::vector<std::string> out;
  for (const auto& t : b.trials) out.push_back(t.candidate.id);
  return out;
}

TEST(TunerStrategy, GridRunsEveryCandidateOnEveryWorkload) {
  const SweepSpec s = parse_strategy_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 16], schedule_policy: [fcfs, lpm]}
workloads: [{name: a, dataset: random}, {name: b, dataset: random}]
repeat: 2
)");
  SearchSpace space(s);
  auto st = Strategy::make(s, space);
  EXPECT_EQ(st->planned_runs(), 4u * 2u * 2u);
  const auto b = st->next(ResultsTable{});
  ASSERT_TRUE(b);
  EXPECT_EQ(ids(*b), (std::vector<std::string>{"c0", "c1", "c2", "c3"}));
  EXPECT_EQ(b->trials[0].workloads.size(), 2u);
  EXPECT_EQ(b->trials[0].tag, "main");
  EXPECT_FALSE(st->next(ResultsTable{}));
}

TEST(TunerStrategy, StagedKeepsEachStagesWinner) {
  const SweepSpec s = parse_strategy_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 16, 32], schedule_policy: [fcfs, lpm]}
strategy: {kind: staged, stages: [{name: batch, dims: [max_running_requests]}, {name: policy, dims: [schedule_policy]}]}
workloads: [{name: w, dataset: random}]
)");
  SearchSpace space(s);
  const Candidate m8 = space.find({{"max_running_requests", 8}}), m16 = space.find({{"max_running_requests", 16}}),
                  m32 = space.find({{"max_running_requests", 32}});
  const Candidate m16l = space.find({{"max_running_requests", 16}, {"schedule_policy", "lpm"}});
  std::vector<nlohmann::ordered_json> recs = {record(m8, "w", 100), record(m16, "w", 150), record(m32, "w", 120)};
  auto st = Strategy::make(s, space);
  auto b1 = st->next(ResultsTable{});
  ASSERT_TRUE(b1);
  EXPECT_EQ(ids(*b1), (std::vector<std::string>{m8.id, m16.id, m32.id}));
  auto b2 = st->next(ResultsTable::build(recs));
  ASSERT_TRUE(b2);
  EXPECT_EQ(b2->stage, "policy");
  EXPECT_EQ(ids(*b2), (std::vector<std::string>{m16.id, m16l.id}));  // around the winner; m16 is reused, not re-run
  recs.push_back(record(m16l, "w", 170));
  EXPECT_FALSE(st->next(ResultsTable::build(recs)));
  ASSERT_EQ(st->stages().size(), 2u);
  EXPECT_EQ(st->stages()[0].incumbent, m8.id);
  EXPECT_EQ(st->stages()[0].winner, m16.id);
  EXPECT_EQ(st->stages()[1].winner, m16l.id);
  // Replaying over the stored results gives the same batches.
  auto replay = Strategy::make(s, space);
  const ResultsTable all = ResultsTable::build(recs);
  EXPECT_EQ(ids(*replay->next(all)), ids(*b1));
  EXPECT_EQ(ids(*replay->next(all)), ids(*b2));
  EXPECT_FALSE(replay->next(all));
}

TEST(TunerStrategy, StagedRespectsTheSlo) {
  const SweepSpec s = parse_strategy_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [8, 16]}
strategy: {kind: staged, stages: [{name: batch, dims: [max_running_requests]}]}
workloads: [{name: w, dataset: random}]
slo: {mean_tpot_ms: 50}
)");
  SearchSpace space(s);
  const Candidate a = space.at(0), b = space.at(1);
  auto st = Strategy::make(s, space);
  st->next(ResultsTable{});
  EXPECT_FALSE(st->next(ResultsTable::build({record(a, "w", 100, 40), record(b, "w", 300, 80)})));
  EXPECT_EQ(st->stages()[0].winner, a.id);  // b is faster but breaks the SLO
}

TEST(TunerStrategy, HalvingScreensThenRunsTheBestAndTheBaseline) {
  const SweepSpec s = parse_strategy_spec(R"(name: t
target: {engine: builtin, model: m.gguf}
space: {max_running_requests: [1, 2, 3, 4, 5, 6, 7, 8]}
strategy: {kind: halving, screen_prompts: 10, keep: 0.25}
workloads: [{name: w, dataset: random, num_prompts: 100}, {name: v, dataset: random}]
)");
  SearchSpace space(s);
  auto st = Strategy::make(s, space);
  auto b1 = st->next(ResultsTable{});
  ASSERT_TRUE(b1);
  ASSERT_EQ(b1->trials.size(), 8u);
  EXPECT_EQ(b1->trials[0].tag, "screen10");
  ASSERT_EQ(b1->trials[0].workloads.size(), 1u);
  EXPECT_EQ(b1->trials[0].workloads[0].name, "w@screen10");
  EXPECT_EQ(b1->trials[0].workloads[0].data.num_prompts, 10);
  std::vector<nlohmann::ordered_json> recs;
  for (size_t i = 0; i < 8; ++i) recs.push_back(record(space.at(i), "w@screen10", 10.0 * static_cast<double>(i)));
  auto b2 = st->next(ResultsTable::build(recs));
  ASSERT_TRUE(b2);
  EXPECT_EQ(ids(*b2), (std::vector<std::string>{"c0", "c6", "c7"}));  // best quarter + the baseline
  EXPECT_EQ(b2->trials[0].tag, "main");
  EXPECT_EQ(b2->trials[0].workloads.size(), 2u);
  EXPECT_FALSE(st->next(ResultsTable::build(recs)));
  EXPECT_EQ(st->stages()[0].kept, 2u);
}

// Bayes (TPE) on a synthetic 4 x 4 x 4 space (4 candidates skipped by a constraint) whose throughput rises with
// max_running_requests and chunked_prefill_size and peaks at page_size 32: within a budget of a third of the
// candidates it finds the best or one within 2% for every seed, proposes nothing twice and nothing skipped, and
// replaying it over the final results proposes the same candidates in the same order (resume, report).
constexpr const char* kBayesSpace = R"(name: t
target: {engine: builtin, model: m.gguf}
space:
  max_running_requests: [8, 16, 32, 64]
  chunked_prefill_size: [256, 512, 1024, 2048]
  page_size: [8, 16, 32, 64]
constraints: ["max_running_requests * page_size <= 2048"]
strategy: {kind: bayes, budget: 20, seed: SEED}
workloads: [{name: w, dataset: random}]
)";

double synthetic_tps(const Candidate& c) {
  const auto index = [](int64_t v, std::initializer_list<int64_t> values) {
    return static_cast<double>(std::find(values.begin(), values.end(), v) - values.begin());
  };
  const double a = index(c.settings["max_running_requests"].get<int64_t>(), {8, 16, 32, 64});
  const double b = index(c.settings["chunked_prefill_size"].get<int64_t>(), {256, 512, 1024, 2048});
  const double p = index(c.settings["page_size"].get<int64_t>(), {8, 16, 32, 64});
  return 100.0 + 30.0 * a + 20.0 * b - 10.0 * std::fabs(p - 2.0);
}

std::vector<std::string> run_bayes(const SweepSpec& s, const SearchSpace& space, std::vector<nlohmann::ordered_json>& recs) {
  auto st = Strategy::make(s, space);
  std::vector<std::string> order;
  while (auto b = st->next(ResultsTable::build(recs))) {
    for (const Trial& t : b->trials) {
      order.push_back(t.candidate.id);
      recs.push_back(record(t.candidate, "w", synthetic_tps(t.candidate)));
    }
  }
  return order;
}

TEST(TunerStrategy, BayesFindsTheBestWithinItsBudgetDeterministically) {
  double best_possible = 0.0;
  for (int seed = 0; seed < 10; ++seed) {
    std::string text = kBayesSpace;
    text.replace(text.find("SEED"), 4, std::to_string(seed));
    const SweepSpec s = parse_strategy_spec(text);
    SearchSpace space(s);
    if (best_possible == 0.0) {
      for (size_t i = 0; i < space.size(); ++i) {
        if (space.at(i).skip_reason.empty()) best_possible = std::max(best_possible, synthetic_tps(space.at(i)));
      }
    }
    std::vector<nlohmann::ordered_json> recs;
    const std::vector<std::string> order = run_bayes(s, space, recs);
    EXPECT_EQ(order.size(), 20u) << "seed " << seed;
    EXPECT_EQ(std::set<std::string>(order.begin(), order.end()).size(), order.size()) << "seed " << seed;
    EXPECT_EQ(order[0], space.baseline().id);
    double found = 0.0;
    for (const auto& id : order) {
      const Candidate c = space.at(std::stoul(id.substr(1)));
      EXPECT_EQ(c.skip_reason, "") << id;
      found = std::max(found, synthetic_tps(c));
    }
    EXPECT_GE(found, 0.98 * best_possible) << "seed " << seed;
    // The same seed again, and a replay over the final results: the same candidates in the same order.
    std::vector<nlohmann::ordered_json> again;
    EXPECT_EQ(run_bayes(s, space, again), order);
    auto replay = Strategy::make(s, space);
    std::vector<std::string> replayed;
    while (auto b = replay->next(ResultsTable::build(recs))) {
      for (const Trial& t : b->trials) replayed.push_back(t.candidate.id);
    }
    EXPECT_EQ(replayed, order) << "seed " << seed;
    EXPECT_EQ(replay->stages().size(), 1u);
    EXPECT_FALSE(replay->stages()[0].winner.empty());
  }
}

TEST(TunerStrategy, BayesSpecNeedsABudget) {
  for (const auto& [strategy, words] : std::vector<std::pair<std::string, std::string>>{
           {"{kind: bayes}", "bayes needs budget"}, {"{kind: bayes, budget: 4, startup: 5}", "must not exceed budget (4)"},
           {"{kind: bayse, budget: 4}", "grid, staged, halving or bayes"}}) {
    try {
      parse_strategy_spec("name: t\ntarget: {engine: builtin, model: m.gguf}\nspace: {max_running_requests: [1, 2]}\n"
                          "strategy: " + strategy + "\nworkloads: [{name: w, dataset: random}]\n");
      ADD_FAILURE() << strategy;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
}

// The stored space (results/bayes-space: a 48-candidate grid on stories260K measured 3 times each, kept by
// scripts/store_space.py): bayes with a budget of 14 (30% of the grid), replayed over the stored measurements for 20
// seeds, against random search in the same budget. Prints the mean best-so-far curve of both (docs/sweep-file.md).
TEST(TunerStrategy, BayesOnTheStoredSpaceReachesTheGridsBestInThirtyPercent) {
  std::ifstream in(testing::source_path("results/bayes-space/space.json"));
  ASSERT_TRUE(in) << "results/bayes-space/space.json";
  const nlohmann::json stored = nlohmann::json::parse(in);
  std::ifstream sweep_file(testing::source_path("results/bayes-space/sweep.yaml"));
  std::string sweep((std::istreambuf_iterator<char>(sweep_file)), std::istreambuf_iterator<char>());
  sweep.replace(sweep.find("tests/data/stories260K.gguf"), 27, testing::stories_path());
  std::map<std::string, std::vector<double>> samples;
  double grid_best = 0.0;
  for (const auto& c : stored.at("candidates")) {
    samples[c.at("id").get<std::string>()] = c.at("samples").at("mixed").get<std::vector<double>>();
    grid_best = std::max(grid_best, median(samples[c.at("id").get<std::string>()]));
  }
  ASSERT_EQ(samples.size(), 48u);
  constexpr int kSeeds = 20;
  constexpr size_t kBudget = 14;
  std::vector<double> bayes_curve(kBudget, 0.0), random_curve(kBudget, 0.0);
  int bayes_hits = 0, random_hits = 0;
  for (int seed = 0; seed < kSeeds; ++seed) {
    const SweepSpec s = parse_strategy_spec(sweep + "strategy: {kind: bayes, budget: " + std::to_string(kBudget) +
                                            ", seed: " + std::to_string(seed) + "}\n");
    SearchSpace space(s);
    auto st = Strategy::make(s, space);
    std::vector<nlohmann::ordered_json> recs;
    std::vector<std::string> order;
    while (auto b = st->next(ResultsTable::build(recs))) {
      for (const Trial& t : b->trials) {
        order.push_back(t.candidate.id);
        const std::vector<double>& v = samples.at(t.candidate.id);
        for (size_t r = 0; r < v.size(); ++r) {
          nlohmann::ordered_json rec = record(t.candidate, "mixed", v[r]);
          rec["repeat"] = static_cast<int>(r);
          recs.push_back(rec);
        }
      }
    }
    ASSERT_EQ(order.size(), kBudget);
    std::vector<std::string> shuffled;
    for (const auto& [id, v] : samples) shuffled.push_back(id);
    std::mt19937_64 rng(static_cast<uint64_t>(seed) + 1000);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    double best = 0.0, best_random = 0.0;
    for (size_t k = 0; k < kBudget; ++k) {
      best = std::max(best, median(samples.at(order[k])));
      best_random = std::max(best_random, median(samples.at(shuffled[k])));
      bayes_curve[k] += best / grid_best / kSeeds;
      random_curve[k] += best_random / grid_best / kSeeds;
    }
    bayes_hits += best >= 0.98 * grid_best;
    random_hits += best_random >= 0.98 * grid_best;
  }
  std::printf("evaluations | bayes: mean best / grid best | random search\n");
  for (size_t k = 0; k < kBudget; ++k) std::printf("%zu | %.4f | %.4f\n", k + 1, bayes_curve[k], random_curve[k]);
  std::printf("within 2%% of the grid's best after %zu: bayes %d of %d seeds, random %d of %d\n", kBudget, bayes_hits, kSeeds,
              random_hits, kSeeds);
  EXPECT_GE(bayes_curve.back(), 0.98);
  EXPECT_GT(bayes_hits, random_hits);
}

}  // namespace
}  // namespace servetune::tuner
