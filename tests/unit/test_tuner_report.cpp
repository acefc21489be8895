// Reports from a synthetic run folder: conclusion with the best settings, the % change against the baseline and
// the command lines that reproduce it; stage gains; skipped candidates with reasons; HTML with inline SVG charts
// (bars, Pareto front, concurrency lines) and no scripts; CSV; a folder of records without a sweep file; intervals
// of the mean over repeats in the candidate tables and as whiskers on the bars.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "report/report.h"
#include "tuner/results_store.h"
#include "tuner/space.h"
#include "report/svg_chart.h"

namespace servetune::tuner {
namespace {
using namespace servetune::report;     // reports and the check
namespace fs = std::filesystem;

const char* kSweep = R"(name: demo
description: A synthetic sweep.
target: {engine: builtin, model: models/m.gguf, settings: {threads: 2}}
space:
  max_running_requests: [8, 32]
  schedule_policy: [fcfs, lpm]
  tp_size: [1, 2]
strategy:
  kind: staged
  stages:
    - {name: batching, dims: [max_running_requests]}
    - {name: policy, dims: [schedule_policy]}
    - {name: parallel, dims: [tp_size]}
workloads:
  - {name: chat, dataset: random, input_len: 64, output_len: 16, num_prompts: 10}
  - {name: load, dataset: random, num_prompts: 10, max_concurrency: [1, 4]}
)";

nlohmann::ordered_json record(const Candidate& c, const SweepSpec& s, const std::string& w, double tps, double tpot) {
  nlohmann::ordered_json r;
  r["schema"] = kRecordSchema;
  r["candidate"] = {{"id", c.id}, {"label", c.label}, {"settings", c.settings}, {"full_settings", SearchSpace(s).full_settings(c)}};
  r["workload"] = s.workload(w)->to_json();
  r["repeat"] = 0;
  r["metrics"] = {{"completed", 10}, {"failed", 0}, {"total_token_throughput", tps}, {"output_throughput", tps / 4},
                  {"mean_tpot_ms", tpot}, {"p99_tpot_ms", tpot * 1.5}};
  r["provenance"] = {
      {"source", "measured"},
      {"environment", {{"cpu_model", "Test CPU"}, {"engine_cpu_isa", "avx2"}, {"git_commit", "abc123"}}}};
  return r;
}

class TunerReport : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("servetune_report_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    const SpecFile f = parse_spec_text(kSweep, "demo.yaml");
    spec_ = parse_sweep(f);
    ResultsStore store(dir_.string());
    store.create(f.root, "demo.yaml", kSweep);
    SearchSpace space(spec_);
    const Candidate base = space.baseline();
    const Candidate big = space.find({{"max_running_requests", 32}});
    const Candidate lpm = space.find({{"max_running_requests", 32}, {"schedule_policy", "lpm"}});
    const Candidate tp2 = space.find({{"max_running_requests", 32}, {"tp_size", 2}});
    const std::vector<std::pair<Candidate, double>> measured = {{base, 100}, {big, 150}, {lpm, 140}};
    for (const auto& [c, tps] : measured) {
      store.write_record(record(c, spec_, "chat", tps, 3000 / tps));
      store.write_record(record(c, spec_, "load@c1", tps / 2, 10));
      store.write_record(record(c, spec_, "load@c4", tps, 20));
      store.write_trial({{"candidate", c.id}, {"tag", "main"}, {"status", "ok"}, {"candidate_info", {{"id", c.id}, {"label", c.label}, {"settings", c.settings}}}});
    }
    // (models/m.gguf does not exist, so the space cannot know this model's heads; the reason is the one it would give)
    const std::string reason = "the engine rejects it: tp_size 2 cannot split the model's 9 attention heads and 1 KV heads";
    store.write_trial({{"candidate", tp2.id}, {"tag", "main"}, {"status", "skipped"}, {"reason", reason},
                       {"candidate_info", {{"id", tp2.id}, {"label", tp2.label}, {"settings", tp2.settings}}}});
    base_ = base.id;
    best_ = big.id;
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  SweepSpec spec_;
  std::string base_, best_;
};

TEST_F(TunerReport, MarkdownLeadsWithTheConclusion) {
  const ReportData d = load_report(dir_.string());
  EXPECT_EQ(d.baseline, base_);
  EXPECT_EQ(d.best, best_);
  ASSERT_EQ(d.stages.size(), 3u);
  EXPECT_EQ(d.stages[0].winner, best_);
  const std::string md = render_markdown(d);
  const size_t conclusion = md.find("## Conclusion"), table = md.find("## Baseline vs best"), stages = md.find("## Gain per stage"),
               cands = md.find("## Candidates");
  ASSERT_NE(conclusion, std::string::npos);
  EXPECT_LT(conclusion, table);
  EXPECT_LT(table, stages);
  EXPECT_LT(stages, cands);
  EXPECT_NE(md.find("**Best: `" + best_ + "`** (max_running_requests=32, schedule_policy=fcfs, tp_size=1)"), std::string::npos) << md;
  EXPECT_NE(md.find("**+50.0%** over the baseline"), std::string::npos) << md;
  EXPECT_NE(md.find("servetune serve --model models/m.gguf --threads 2 --max-running-requests 32"), std::string::npos) << md;
  EXPECT_NE(md.find("servetune bench --backend builtin --model models/m.gguf --threads 2 --max-running-requests 32 --dataset-name random"), std::string::npos) << md;
  EXPECT_NE(md.find("| chat | 100 | 150 | +50.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 30 | 20 | -33.3% |"), std::string::npos) << md;  // mean TPOT baseline -> best
  EXPECT_NE(md.find("| batching | max_running_requests | 2 | `" + base_ + "` | `" + best_ + "` | 100 | 150 | +50.0% | +50.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("tp_size 2 cannot split the model's 9 attention heads"), std::string::npos);  // the skipped candidate's reason
  EXPECT_NE(md.find("Test CPU"), std::string::npos);
  EXPECT_NE(md.find("| built-in engine's CPU kernels | avx2 |"), std::string::npos);
  EXPECT_EQ(md.find("95% CI of the mean"), std::string::npos);  // one repeat each: no interval column
}

// With repeats the candidate tables add the Student-t interval of the mean total tok/s: the baseline's 100, 90, 110
// give 100 +- t(0.975, 2) x 10 / sqrt(3) = [75.2, 125]; candidates with one repeat show "-".
TEST_F(TunerReport, RepeatsShowTheIntervalOfTheMean) {
  ResultsStore store(dir_.string());
  const Candidate base = SearchSpace(spec_).baseline();
  for (const auto& [repeat, tps] : {std::pair{1, 90.0}, std::pair{2, 110.0}}) {
    auto r = record(base, spec_, "chat", tps, 3000 / tps);
    r["repeat"] = repeat;
    store.write_record(r);
  }
  const std::string md = render_markdown(load_report(dir_.string()));
  EXPECT_NE(md.find("| total tok/s | total tok/s, 95% CI of the mean |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 100 | [75.2, 125] |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 150 | - |"), std::string::npos) << md;
  // The HTML's throughput bars carry the same interval as a whisker.
  const std::string html = render_html(load_report(dir_.string()));
  EXPECT_NE(html.find("Total token throughput on chat (median; whiskers: 95% interval of the mean)"), std::string::npos);
  EXPECT_NE(html.find(": 95% interval of the mean [75.2, 125]</title>"), std::string::npos);
}

TEST_F(TunerReport, HtmlIsSelfContainedWithCharts) {
  const std::string html = render_html(load_report(dir_.string()));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<h2>Conclusion</h2>"), std::string::npos);
  EXPECT_NE(html.find("Total token throughput on chat"), std::string::npos);
  EXPECT_NE(html.find("Pareto front"), std::string::npos);
  EXPECT_NE(html.find("Throughput vs max concurrency on load"), std::string::npos);
  EXPECT_NE(html.find("mean_tpot_ms vs max concurrency on load"), std::string::npos);
  EXPECT_NE(html.find("Throughput vs mean_tpot_ms on load (one point per load level)"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
}

TEST_F(TunerReport, CsvAndBaselineOverride) {
  const ReportData d = load_report(dir_.string(), best_);
  EXPECT_EQ(d.baseline, best_);
  const std::string csv = summary_csv(d);
  EXPECT_EQ(csv.rfind("candidate,label,status,failure,reason,max_running_requests,schedule_policy,tp_size,workload", 0), 0u) << csv;
  EXPECT_NE(csv.find(",skipped,,"), std::string::npos);
  EXPECT_THROW(load_report(dir_.string(), "nope"), Error);
}

TEST_F(TunerReport, RecordsWithoutASweepFile) {
  const fs::path only = dir_ / "records";
  const ReportData d = load_report(only.string());
  EXPECT_FALSE(d.spec);
  EXPECT_EQ(d.best, best_);
  const std::string md = render_markdown(d);
  EXPECT_NE(md.find("## Baseline vs best"), std::string::npos);
}

TEST(TunerSvg, TicksCoverTheRange) {
  EXPECT_EQ(nice_ticks(0, 23951), (std::vector<double>{0, 5000, 10000, 15000, 20000, 25000}));
  EXPECT_EQ(nice_ticks(0, 1), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
  EXPECT_NE(bar_chart("t", "y", {{"a<b", 1.0, "#000"}}).find("a&lt;b"), std::string::npos);
}

}  // namespace
}  // namespace servetune::tuner
