// Results store (atomic files, partial trials discarded, records from run folders and bench JSON), the results
// table (medians over repeats, groups, SLO scores) and the regression check's tolerances and verdicts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "report/check.h"
#include "tuner/results_store.h"
#include "tuner/results_table.h"

namespace servetune::tuner {
namespace {
using namespace servetune::report;     // reports and the check
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("servetune_tuner_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

nlohmann::ordered_json record(const std::string& cand, const std::string& workload, int repeat,
                              const nlohmann::ordered_json& metrics, const std::string& group = "") {
  nlohmann::ordered_json r;
  r["schema"] = kRecordSchema;
  r["candidate"] = {{"id", cand}, {"label", cand}, {"settings", {{"x", cand}}}};
  r["workload"] = {{"name", workload}, {"group", group.empty() ? workload : group}};
  r["repeat"] = repeat;
  r["metrics"] = metrics;
  return r;
}

TEST(TunerStore, AtomicWritesLeaveNoTempFiles) {
  const fs::path dir = temp_dir("atomic");
  write_file_atomic((dir / "a" / "b.json").string(), "{\"v\": 1}\n");
  write_file_atomic((dir / "a" / "b.json").string(), "{\"v\": 2}\n");
  EXPECT_EQ(read_text_file((dir / "a" / "b.json").string()), "{\"v\": 2}\n");
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u);
  fs::remove_all(dir);
}

TEST(TunerStore, RecordsTrialsAndPartialDiscard) {
  const fs::path dir = temp_dir("store");
  ResultsStore store(dir.string());
  store.create({{"name", "t"}}, "t.yaml", "name: t\n");
  EXPECT_TRUE(store.exists());
  EXPECT_THROW(store.create({{"name", "t"}}, "t.yaml", "name: t\n"), Error);
  store.write_record(record("c0", "w", 0, {{"total_token_throughput", 1.0}}));
  store.write_record(record("c0", "w", 1, {{"total_token_throughput", 2.0}}));
  store.write_record(record("c0", "v", 0, {{"total_token_throughput", 3.0}}));
  EXPECT_EQ(store.records().size(), 3u);
  EXPECT_FALSE(store.trial("c0", "main"));
  store.write_trial({{"candidate", "c0"}, {"tag", "main"}, {"status", "ok"}, {"candidate_info", {{"id", "c0"}}}});
  EXPECT_TRUE(store.trial("c0", "main"));
  store.discard_partial("c0", {"w"});
  EXPECT_EQ(store.records().size(), 1u);
  EXPECT_EQ(load_records(dir.string()).size(), 1u);
  EXPECT_EQ(store.sweep()["source"], "t.yaml");
  fs::remove_all(dir);
}

TEST(TunerStore, BenchResultJsonBecomesARecord) {
  const fs::path dir = temp_dir("bench");
  std::ofstream(dir / "vllm.json") << R"({"backend": "vllm", "label": null, "dataset_name": "random", "max_concurrency": 8,
    "completed": 10, "total_token_throughput": 1234.5, "mean_tpot_ms": 12.5, "date": "20250101-000000"})";
  const auto recs = load_records((dir / "vllm.json").string());
  ASSERT_EQ(recs.size(), 1u);
  EXPECT_EQ(recs[0]["candidate"]["id"], "vllm");
  EXPECT_EQ(recs[0]["workload"]["name"], "random");
  EXPECT_EQ(recs[0]["metrics"]["total_token_throughput"], 1234.5);
  std::ofstream(dir / "bad.json") << "{\"hello\": 1}";
  EXPECT_THROW(load_records((dir / "bad.json").string()), Error);
  EXPECT_THROW(load_records((dir / "missing").string()), Error);
  fs::remove_all(dir);
}

TEST(TunerTable, MediansGroupsAndScores) {
  std::vector<nlohmann::ordered_json> recs;
  for (int r = 0; r < 3; ++r) recs.push_back(record("c0", "w", r, {{"total_token_throughput", 100.0 + 10 * r}, {"p99_tpot_ms", 40.0}}));
  recs.push_back(record("c1", "w", 0, {{"total_token_throughput", 130.0}, {"p99_tpot_ms", 60.0}}));
  recs.push_back(record("c0", "load@c1", 0, {{"output_throughput", 10.0}, {"mean_tpot_ms", 20.0}}, "load"));
  recs.push_back(record("c0", "load@c8", 0, {{"output_throughput", 50.0}, {"mean_tpot_ms", 45.0}}, "load"));
  recs.push_back(record("c0", "load@c64", 0, {{"output_throughput", 90.0}, {"mean_tpot_ms", 70.0}}, "load"));
  const ResultsTable t = ResultsTable::build(recs);
  EXPECT_EQ(t.metric("c0", "w", "total_token_throughput"), 110.0);
  EXPECT_EQ(t.cell("c0", "w")->repeats, 3);
  EXPECT_EQ(t.group("load"), (std::vector<std::string>{"load@c1", "load@c8", "load@c64"}));
  EXPECT_EQ(t.groups(), (std::vector<std::string>{"w", "load"}));
  Goal g{"w", "total_token_throughput", true, {{"p99_tpot_ms", 50.0}}};
  EXPECT_TRUE(score(t, "c0", g).feasible);
  EXPECT_FALSE(score(t, "c1", g).feasible);
  EXPECT_NE(score(t, "c1", g).violation.find("p99_tpot_ms 60 > 50"), std::string::npos);
  EXPECT_EQ(best_of(t, {"c0", "c1"}, g), "c0");
  Goal conc{"load", "output_throughput", true, {{"mean_tpot_ms", 50.0}}};
  const Score s = score(t, "c0", conc);
  EXPECT_EQ(s.workload, "load@c8");  // the best level inside the SLO
  EXPECT_EQ(s.value, 50.0);
}

// A level whose requests failed beyond max_failed_fraction (an SLA search's overloaded level) is infeasible, however
// good its latency; below the fraction it counts.
TEST(TunerTable, LevelsWithTooManyFailedRequestsAreInfeasible) {
  std::vector<nlohmann::ordered_json> recs;
  recs.push_back(record("c0", "load@c4", 0, {{"output_throughput", 40.0}, {"p99_tpot_ms", 20.0}, {"completed", 99}, {"failed", 1}}, "load"));
  recs.push_back(record("c0", "load@c8", 0, {{"output_throughput", 60.0}, {"p99_tpot_ms", 20.0}, {"completed", 70}, {"failed", 30}}, "load"));
  const ResultsTable t = ResultsTable::build(recs);
  Goal g{"load", "output_throughput", true, {{"p99_tpot_ms", 50.0}}};
  g.max_failed_fraction = 0.01;
  EXPECT_EQ(score(t, "c0", g).workload, "load@c4");
  g.max_failed_fraction = 0.001;
  const Score none = score(t, "c0", g);
  EXPECT_FALSE(none.feasible);
  EXPECT_NE(none.violation.find("of its requests failed"), std::string::npos) << none.violation;
  g.max_failed_fraction = 1.0;
  EXPECT_EQ(score(t, "c0", g).workload, "load@c8");
}

// objective kind max_load_under_slo: the highest load (offered_load, from the level's workload) whose SLOs hold
// ranks first, whatever the throughput there; candidates reaching the same load are ranked by their goodput.
TEST(TunerTable, MaxLoadUnderSloRanksByTheHighestFeasibleLoad) {
  const auto level = [](const std::string& cand, int conc, double tput, double goodput, double tpot) {
    auto r = record(cand, "load@c" + std::to_string(conc), 0,
                    {{"total_token_throughput", tput}, {"request_goodput", goodput}, {"mean_tpot_ms", tpot}}, "load");
    r["workload"]["max_concurrency"] = conc;
    r["workload"]["request_rate"] = nullptr;
    return r;
  };
  std::vector<nlohmann::ordered_json> recs = {
      level("c0", 8, 900.0, 3.0, 40.0), level("c0", 16, 1000.0, 3.5, 60.0),  // c0 holds the SLO up to 8 users
      level("c1", 8, 500.0, 2.0, 30.0), level("c1", 16, 800.0, 2.5, 45.0),   // c1 up to 16, at less throughput
      level("c2", 16, 700.0, 2.9, 49.0)};                                    // c2 up to 16 too, more goodput
  const ResultsTable t = ResultsTable::build(recs);
  EXPECT_EQ(t.metric("c1", "load@c16", "offered_load"), 16.0);
  Goal g{"load", "offered_load", true, {{"mean_tpot_ms", 50.0}}};
  g.tiebreak = "request_goodput";
  EXPECT_EQ(score(t, "c0", g).value, 8.0);
  EXPECT_EQ(score(t, "c1", g).value, 16.0);
  EXPECT_EQ(best_of(t, {"c0", "c1", "c2"}, g), "c2");
  EXPECT_EQ(best_of(t, {"c0", "c1"}, g), "c1");
  nlohmann::ordered_json rate = {{"request_rate", 2.5}, {"max_concurrency", 64}};
  EXPECT_EQ(offered_load(rate), 2.5);  // a rate level capped by a concurrency: the rate is the load
  EXPECT_EQ(offered_load(nlohmann::ordered_json{{"request_rate", nullptr}, {"max_concurrency", nullptr}}), std::nullopt);
}

TEST(TunerCheck, ToleranceSyntax) {
  Tolerance t = parse_tolerance("total_token_throughput=-5%");
  EXPECT_EQ(t.direction, '-');
  EXPECT_TRUE(t.relative);
  EXPECT_EQ(t.amount, 5.0);
  t = parse_tolerance("p99_tpot_ms=+2.5");
  EXPECT_EQ(t.direction, '+');
  EXPECT_FALSE(t.relative);
  t = parse_tolerance("total_output_tokens=0");
  EXPECT_EQ(t.direction, '~');
  EXPECT_EQ(parse_tolerance("x=\xC2\xB1" "3%").direction, '~');
  for (const char* bad : {"total_token_throughput", "=5%", "x=-", "x=fast", "x=-5%%"}) EXPECT_THROW(parse_tolerance(bad), Error) << bad;
}

TEST(TunerCheck, VerdictsPerDirection) {
  const std::vector<nlohmann::ordered_json> base = {
      record("c0", "w", 0, {{"tps", 100.0}, {"tpot", 10.0}, {"tokens", 512}}),
      record("c0", "w", 1, {{"tps", 104.0}, {"tpot", 10.0}, {"tokens", 512}}),
      record("c0", "w", 2, {{"tps", 96.0}, {"tpot", 11.0}, {"tokens", 512}})};
  const std::vector<Tolerance> tol = {parse_tolerance("tps=-5%"), parse_tolerance("tpot=+10%"), parse_tolerance("tokens=0")};
  auto verdicts = [&](double tps, double tpot, int tokens) {
    const CheckResult r = run_check(base, {record("other", "w", 0, {{"tps", tps}, {"tpot", tpot}, {"tokens", tokens}})}, tol);
    std::string out;
    for (const auto& row : r.rows) out += row.regression ? "R" : (row.improved ? "+" : ".");
    return out;
  };
  EXPECT_EQ(verdicts(100.0, 10.0, 512), "...");  // median baseline: 100 tok/s, 10 ms
  EXPECT_EQ(verdicts(95.5, 10.9, 512), "...");
  EXPECT_EQ(verdicts(94.0, 10.0, 512), "R..");
  EXPECT_EQ(verdicts(150.0, 8.0, 512), "++.");
  EXPECT_EQ(verdicts(100.0, 11.5, 512), ".R.");
  EXPECT_EQ(verdicts(100.0, 10.0, 511), "..R");
  const CheckResult missing = run_check(base, {record("c0", "v", 0, {{"tps", 1.0}})}, tol);
  EXPECT_EQ(missing.regressions, 3u);
  EXPECT_TRUE(missing.rows[0].missing);
  EXPECT_THROW(run_check(base, base, {parse_tolerance("nope=1%")}), Error);
}

TEST(TunerCheck, NoiseToleranceFollowsTheBaselinesSpread) {
  EXPECT_TRUE(parse_tolerance("tps=-noise").noise);
  EXPECT_EQ(parse_tolerance("tps=-noise").direction, '-');
  auto runs = [](const std::string& id, const std::vector<double>& tps) {
    std::vector<nlohmann::ordered_json> out;
    for (size_t r = 0; r < tps.size(); ++r) out.push_back(record(id, "w", static_cast<int>(r), {{"tps", tps[r]}}));
    return out;
  };
  const std::vector<Tolerance> tol = {parse_tolerance("tps=-noise")};
  // A tight baseline (mean 100, sd 0.5): three new runs may stray by t(0.995, 2) * 0.5 * sqrt(2/3) = 4.05.
  const auto tight = runs("c0", {100.0, 100.5, 99.5});
  EXPECT_EQ(run_check(tight, runs("c0", {97.0, 97.5, 96.5}), tol).regressions, 0u);
  const CheckResult slow = run_check(tight, runs("c0", {94.0, 95.0, 94.5}), tol);
  ASSERT_EQ(slow.regressions, 1u);
  EXPECT_DOUBLE_EQ(slow.rows[0].baseline, 100.0);  // means, not medians
  EXPECT_DOUBLE_EQ(slow.rows[0].current, 94.5);
  // The same drop against a noisy baseline (sd 4) is within its noise.
  EXPECT_EQ(run_check(runs("c0", {100.0, 104.0, 96.0}), runs("c0", {94.0, 95.0, 94.5}), tol).regressions, 0u);
  EXPECT_EQ(run_check(tight, runs("c0", {140.0}), tol).regressions, 0u);  // better is never a regression
  EXPECT_THROW(run_check(runs("c0", {100.0}), runs("c0", {100.0}), tol), Error);  // no spread to go by
}

TEST(TunerCheck, WarnsOfBaselinesOfAnotherCpuIsa) {
  auto at_isa = [](const std::string& isa) {
    nlohmann::ordered_json r = record("c0", "w", 0, {{"tps", 100.0}});
    if (!isa.empty()) r["provenance"] = {{"source", "measured"}, {"environment", {{"engine_cpu_isa", isa}}}};
    return std::vector<nlohmann::ordered_json>{r};
  };
  const std::vector<Tolerance> tol = {parse_tolerance("tps=-5%")};
  EXPECT_EQ(run_check(at_isa("avx2"), at_isa("avx2"), tol).warning, "");
  EXPECT_EQ(run_check(at_isa(""), at_isa("avx512"), tol).warning, "");  // older records do not name it
  const CheckResult mixed = run_check(at_isa("avx512"), at_isa("avx2"), tol);
  EXPECT_EQ(mixed.regressions, 0u);
  EXPECT_NE(mixed.warning.find("ISA 'avx512', the current results at 'avx2'"), std::string::npos) << mixed.warning;
}

}  // namespace
}  // namespace servetune::tuner
