// Strategies over synthetic results: grid covers the space; staged keeps each stage's winner and varies the next
// stage around it; halving screens everyone and sends the best fraction (and the baseline) to the full workloads;
// replaying a strategy over stored results gives the same batches (what --resume and `report` rely on).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace servetune::tuner
