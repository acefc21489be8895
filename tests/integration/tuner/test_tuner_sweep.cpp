// `servetune sweep | report` end to end on stories260K: a grid with a setting the engine rejects (skipped with the
// reason), records and reports on disk, reports regenerated identically; kill -9 in the middle of a sweep and
// --resume measure every candidate exactly once; bad sweep files exit 2 naming the key; committed configs dry-run.
#include <signal.h>

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "core/cpu_features.h"
#include "test_paths.h"
#include "tuner_cli.h"

namespace servetune::testing {
namespace {
namespace fs = std::filesystem;

std::string stories_sweep(const std::string& name, const std::string& space, const std::string& workloads, int repeat = 1) {
  return "name: " + name + "\ntarget: {engine: builtin, model: " + stories_path() + ", settings: {threads: 1}}\nspace:\n" + space +
         "workloads:\n" + workloads + "repeat: " + std::to_string(repeat) + "\n";
}

TEST(TunerSweep, GridOnStoriesWritesRecordsAndReports) {
  const fs::path dir = scratch("grid");
  write_text(dir / "s.yaml", stories_sweep("grid", "  max_running_requests: [2, 8]\n  tp_size: [1, 2]\n",
                                           "  - {name: short, dataset: random, input_len: 32, output_len: 8, num_prompts: 8, seed: 1}\n"
                                           "  - {name: load, dataset: random, input_len: 16, output_len: 8, num_prompts: 8, max_concurrency: [1, 4]}\n"));
  const fs::path run = dir / "run";
  const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 trials run, 0 reused, 2 candidates skipped, 0 failed"), std::string::npos) << r.output;
  size_t ok = 0, skipped = 0;
  for (const auto& e : fs::directory_iterator(run / "trials")) {
    const auto m = read_json(e.path());
    if (m["status"] == "ok") ++ok;
    if (m["status"] == "skipped") {
      ++skipped;
      EXPECT_NE(m["reason"].get<std::string>().find("the engine rejects it: tp_size x dp_size = 2 ranks need at least one thread each"),
                std::string::npos) << m.dump();
    }
  }
  EXPECT_EQ(ok, 2u);
  EXPECT_EQ(skipped, 2u);
  ASSERT_EQ(count_files(run / "records"), 2u * 3u);
  const auto rec = read_json(run / "records" / "c0" / "short.r0.json");
  EXPECT_EQ(rec["schema"], "servetune.record.v1");
  EXPECT_EQ(rec["candidate"]["settings"]["max_running_requests"], 2);
  EXPECT_EQ(rec["workload"]["dataset"], "random");
  EXPECT_EQ(rec["metrics"]["completed"], 8);
  EXPECT_EQ(rec["metrics"]["total_output_tokens"], 64);
  for (const char* k : {"total_token_throughput", "mean_tpot_ms", "p99_tpot_ms", "engine_steps", "cpu_ms_per_token",
                        "p99_client_lag_ms", "p99_client_send_lag_ms", "mean_per_token_itl_ms"}) {
    EXPECT_TRUE(rec["metrics"].contains(k)) << k;
  }
  EXPECT_EQ(rec["provenance"]["source"], "measured");
  EXPECT_TRUE(rec["provenance"]["environment"].contains("cpu_model"));
  const std::string isa = rec["provenance"]["environment"].value("engine_cpu_isa", std::string());
  EXPECT_TRUE(cpu_isa_from_name(isa).has_value()) << isa;
  EXPECT_EQ(read_json(run / "records" / "c2" / "load@c4.r0.json")["workload"]["max_concurrency"], 4);
  EXPECT_NE(read_text(run / "summary.csv").find("c2,\"max_running_requests=8, tp_size=1\",ok"), std::string::npos);
  const std::string md = read_text(run / "report.md");
  EXPECT_NE(md.find("## Conclusion"), std::string::npos);
  EXPECT_NE(md.find("servetune serve --model"), std::string::npos);
  const CliResult again = servetune("report " + run.string());
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_EQ(again.output, md);  // regenerated from the stored results alone
  const CliResult html = servetune("report " + run.string() + " --format html --output " + (dir / "r.html").string());
  ASSERT_EQ(html.code, 0) << html.output;
  EXPECT_NE(read_text(dir / "r.html").find("<svg"), std::string::npos);
  fs::remove_all(dir);
}

// repeat: auto stops a workload's repeats once the objective's interval is within the width: on a metric that does
// not vary (output tokens) it stops at min; on throughput with a width nothing meets it runs max.
TEST(TunerSweep, RepeatAutoStopsWhenTheIntervalIsNarrowEnough) {
  const fs::path dir = scratch("repeat-auto");
  const std::string workloads = "  - {name: short, dataset: random, input_len: 16, output_len: 4, num_prompts: 4, seed: 1}\n";
  for (const auto& [metric, runs] : {std::pair<const char*, size_t>{"total_output_tokens", 2}, {"total_token_throughput", 4}}) {
    std::string text = stories_sweep("auto", "  max_running_requests: [4]\n", workloads);
    text.replace(text.find("repeat: 1"), 9, "repeat: {min: 2, max: 4, width: 0.000001}");
    text += std::string("objective: {workload: short, metric: ") + metric + "}\n";
    write_text(dir / "s.yaml", text);
    const fs::path run = dir / metric;
    const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string());
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(count_files(run / "records"), runs) << metric << "\n" << r.output;
  }
  fs::remove_all(dir);
}

// SLA search through a sweep: SLOs nothing misses climb to the top of the range (levels 1, 2, 4, 8 recorded as list
// levels are); SLOs nothing meets stop at the first level, and the candidate has no feasible level.
TEST(TunerSweep, SearchedConcurrencyClimbsWhileTheSlosHold) {
  const fs::path dir = scratch("sla");
  for (const auto& [slo, levels] : {std::pair<const char*, std::vector<std::string>>{"100000", {"1", "2", "4", "8"}}, {"0.000001", {"1"}}}) {
    std::string text = stories_sweep("sla", "  max_running_requests: [8]\n",
                                     "  - {name: load, dataset: random, input_len: 16, output_len: 4, num_prompts: 8, "
                                     "max_concurrency: {search: [1, 8], steps: 6}}\n");
    text += std::string("slo: {p99_tpot_ms: ") + slo + "}\n";
    write_text(dir / "s.yaml", text);
    const fs::path run = dir / (std::string("run") + slo);
    const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string());
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_EQ(count_files(run / "records"), levels.size()) << slo << "\n" << r.output;
    for (const auto& l : levels) {
      const auto rec = read_json(run / "records" / "c0" / ("load@c" + l + ".r0.json"));
      EXPECT_EQ(rec["workload"]["group"], "load");
      EXPECT_EQ(rec["workload"]["max_concurrency"], std::stoi(l));
    }
    if (levels.size() > 1) {  // the HTML report plots the levels against the SLO's latency, with its bound
      const std::string html = read_text(run / "report.html");
      EXPECT_NE(html.find("p99_tpot_ms vs max concurrency on load"), std::string::npos);
      EXPECT_NE(html.find("Throughput vs p99_tpot_ms on load (one point per load level)"), std::string::npos);
      EXPECT_NE(html.find(">SLO<"), std::string::npos);
    }
  }
  fs::remove_all(dir);
}

// The accuracy guard: every candidate's perplexity and KL against the baseline candidate in its records and the report;
// an FP8 KV cache whose perplexity rises beyond the bound cannot win, however fast; the baseline's log-probabilities
// are computed once per run folder (a resume reuses them).
TEST(TunerSweep, AccuracyGuardKeepsALessAccurateCandidateFromWinning) {
  const fs::path dir = scratch("accuracy");
  std::string text = stories_sweep("acc", "  kv_cache_dtype: [f32, fp8_e4m3]\n",
                                   "  - {name: short, dataset: random, input_len: 16, output_len: 4, num_prompts: 4, seed: 1}\n");
  text += "accuracy: {dataset: " + data_path("perplexity/text.txt") + ", ctx: 128, chunks: 3}\n";
  text += "slo: {perplexity_increase: 0.000001}\n";
  write_text(dir / "s.yaml", text);
  const fs::path run = dir / "run";
  const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto base = read_json(run / "records" / "c0" / "short.r0.json")["metrics"];
  const auto fp8 = read_json(run / "records" / "c1" / "short.r0.json")["metrics"];
  EXPECT_EQ(base["kl_vs_baseline"], 0.0);
  EXPECT_EQ(base["perplexity_increase"], 0.0);
  EXPECT_GT(fp8["kl_vs_baseline"].get<double>(), 0.0);
  EXPECT_GT(fp8["kl_p99_vs_baseline"].get<double>(), fp8["kl_vs_baseline"].get<double>());
  EXPECT_GT(fp8["perplexity_increase"].get<double>(), 0.000001);
  EXPECT_LT(fp8["top1_agreement_vs_baseline"].get<double>(), 1.0);
  EXPECT_NEAR(read_json(run / "accuracy" / "baseline.json")["perplexity"].get<double>(), base["perplexity"].get<double>(), 1e-9);
  const std::string md = read_text(run / "report.md");
  EXPECT_NE(md.find("**Best: `c0`**"), std::string::npos) << md;
  EXPECT_NE(md.find("| perplexity | KL vs baseline (mean / p99) |"), std::string::npos) << md;
  EXPECT_NE(md.find("perplexity_increase"), std::string::npos);
  // A missing accuracy text is the sweep's error (exit 2, before any candidate runs).
  write_text(dir / "bad.yaml", stories_sweep("acc", "  kv_cache_dtype: [f32]\n",
                                             "  - {name: short, dataset: random, input_len: 16, output_len: 4, num_prompts: 4}\n") +
                                   "accuracy: {dataset: /no/such.txt}\n");
  const CliResult bad = servetune("sweep " + (dir / "bad.yaml").string() + " --output " + (dir / "bad").string());
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("bad.yaml: accuracy.dataset"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("no such file '/no/such.txt'"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

// The built-in engine's prefix cache is flushed before every run: the second level of a workload sends the first's
// prompts and finds none of them cached, unless target.flush_prefix_cache is false.
TEST(TunerSweep, EachRunStartsWithAnEmptyPrefixCache) {
  const fs::path dir = scratch("flush");
  for (const bool flush : {true, false}) {
    std::string text = stories_sweep("flush", "  max_running_requests: [4]\n",
                                     "  - {name: w, dataset: random, input_len: 48, output_len: 4, num_prompts: 4, max_concurrency: [1, 2]}\n");
    if (!flush) text.replace(text.find("settings:"), 9, "flush_prefix_cache: false, settings:");
    write_text(dir / "s.yaml", text);
    const fs::path run = dir / (flush ? "flush" : "keep");
    const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string());
    ASSERT_EQ(r.code, 0) << r.output;
    const double hit = read_json(run / "records" / "c0" / "w@c2.r0.json")["metrics"]["engine_prefix_cache_hit_rate"].get<double>();
    if (flush) EXPECT_EQ(hit, 0.0);
    else EXPECT_GT(hit, 0.5);
  }
  fs::remove_all(dir);
}

TEST(TunerSweep, KillNineThenResumeMeasuresEveryCandidateOnce) {
  const fs::path dir = scratch("resume");
  write_text(dir / "s.yaml", stories_sweep("resume", "  max_running_requests: [1, 2, 4, 8, 16]\n",
                                           "  - {name: w, dataset: random, input_len: 64, output_len: 64, num_prompts: 64, seed: 3}\n", 2));
  const fs::path run = dir / "run";
  const pid_t pid = spawn_servetune("sweep", (dir / "s.yaml").string(), "--output", run.string());
  ASSERT_GE(pid, 0);
  // Kill the sweep once two candidates are complete and the third is in flight.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (count_files(run / "trials") < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the sweep finished before it could be killed";
  const size_t done_before = count_files(run / "trials");
  ASSERT_GE(done_before, 2u);
  ASSERT_LT(done_before, 5u) << "the sweep finished before it could be killed";
  std::map<std::string, std::string> launch_before;
  for (const auto& e : fs::directory_iterator(run / "trials")) {
    if (!is_finished_json(e)) continue;
    const auto m = read_json(e.path());
    launch_before[m["candidate"]] = m["launch_id"];
  }
  // The engine process of the candidate in flight dies with the sweep: nothing is written after the kill.
  const size_t records_at_kill = count_files(run / "records");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(count_files(run / "records"), records_at_kill);

  const CliResult r = servetune("sweep --resume " + run.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(std::to_string(done_before) + " reused"), std::string::npos) << r.output;
  std::map<std::string, std::string> launch_after;
  for (const auto& e : fs::directory_iterator(run / "trials")) {
    if (!is_finished_json(e)) continue;
    const auto m = read_json(e.path());
    EXPECT_EQ(m["status"], "ok") << m.dump();
    launch_after[m["candidate"]] = m["launch_id"];
  }
  ASSERT_EQ(launch_after.size(), 5u);
  for (const auto& [cand, id] : launch_before) EXPECT_EQ(launch_after[cand], id) << cand << " was measured again";
  // Exactly one record per (candidate, repeat), each from its candidate's completed launch.
  size_t records = 0;
  for (const auto& e : fs::recursive_directory_iterator(run / "records")) {
    if (!is_finished_json(e)) continue;
    ++records;
    const auto rec = read_json(e.path());
    EXPECT_EQ(rec["provenance"]["launch_id"], launch_after[rec["candidate"]["id"]]) << e.path();
  }
  EXPECT_EQ(records, 5u * 2u);
  EXPECT_TRUE(fs::exists(run / "report.md"));
  const CliResult again = servetune("sweep --resume " + run.string());
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_NE(again.output.find("0 trials run, 5 reused"), std::string::npos) << again.output;
  fs::remove_all(dir);
}

// --parallel 2: two trial processes at a time, each pinned to one of the two CPU shares; one record per candidate.
TEST(TunerSweep, ParallelTrialsRunEachOnTheirShareOfTheCpus) {
  const fs::path dir = scratch("parallel");
  write_text(dir / "s.yaml", stories_sweep("par", "  max_running_requests: [1, 2, 4, 8]\n", "  - {name: w, dataset: random, input_len: 32, output_len: 16, num_prompts: 16, seed: 3}\n"));
  const fs::path run = dir / "run";
  const CliResult r = servetune("sweep " + (dir / "s.yaml").string() + " --output " + run.string() + " --parallel 2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("started (cpus 0;"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("started (cpus 1;"), std::string::npos) << r.output;
  for (const char* c : {"c0", "c1", "c2", "c3"}) EXPECT_TRUE(fs::exists(run / "raw" / c / "trial-main.log")) << c;
  size_t ok = 0;
  for (const auto& e : fs::directory_iterator(run / "trials")) ok += read_json(e.path())["status"] == "ok" ? 1 : 0;
  EXPECT_EQ(ok, 4u);
  EXPECT_EQ(count_files(run / "records"), 4u);
  const CliResult too_many = servetune("sweep " + (dir / "s.yaml").string() + " --output " + (dir / "run2").string() + " --parallel 4096");
  EXPECT_EQ(too_many.code, 2) << too_many.output;
  EXPECT_NE(too_many.output.find("--parallel 4096 needs a CPU per trial"), std::string::npos) << too_many.output;
  fs::remove_all(dir);
}

TEST(TunerSweep, BadInputsExitTwoWithOneMessage) {
  const fs::path dir = scratch("bad");
  auto expect_usage = [&](const std::string& args, const std::vector<std::string>& parts) {
    const CliResult r = servetune(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    for (const auto& p : parts) EXPECT_NE(r.output.find(p), std::string::npos) << p << " not in: " << r.output;
  };
  const std::string ok_workloads = "  - {name: w, dataset: random, num_prompts: 2}\n";
  write_text(dir / "unknown.yaml", stories_sweep("bad", "  max_running_requests: [2]\n  warp_speed: [9]\n", ok_workloads));
  expect_usage("sweep " + (dir / "unknown.yaml").string(), {"unknown.yaml: space.warp_speed (line 5)", "unknown engine setting 'warp_speed'"});
  write_text(dir / "nomodel.yaml", "name: x\ntarget: {engine: builtin, model: /no/such.gguf}\nworkloads:\n" + ok_workloads);
  expect_usage("sweep " + (dir / "nomodel.yaml").string(), {"target.model", "/no/such.gguf"});
  write_text(dir / "nodata.yaml", stories_sweep("x", "  max_running_requests: [2]\n", "  - {name: w, dataset: trace, dataset_path: /no/trace.jsonl}\n"));
  expect_usage("sweep " + (dir / "nodata.yaml").string(), {"workload w", "/no/trace.jsonl"});
  write_text(dir / "impossible.yaml",
             stories_sweep("x", "  max_running_requests: [2, 4]\n", ok_workloads) + "constraints: [\"max_running_requests > 4\"]\n");
  expect_usage("sweep " + (dir / "impossible.yaml").string(), {"impossible.yaml: constraints", "every candidate"});
  expect_usage("sweep --resume " + dir.string(), {"not a sweep run folder"});
  expect_usage("sweep " + (dir / "missing.yaml").string(), {"missing.yaml"});
  expect_usage("report " + (dir / "nothing").string(), {"no such file or folder"});
  expect_usage("check --baseline " + dir.string() + " --current " + dir.string() + " --tolerance tps", {"--tolerance 'tps'"});
  EXPECT_EQ(count_files(dir / "results"), 0u);  // nothing ran, nothing was written
  fs::remove_all(dir);
}

TEST(TunerSweep, CommittedConfigsDryRun) {
  const auto dry = [](const std::string& config) { return servetune("sweep " + source_path("configs/" + config) + " --dry-run"); };
  CliResult r = dry("deepseek-r1-h200.yaml");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* s : {"python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-R1-0528", "--tp 8", "vllm serve",
                        "--tensor-parallel-size 8", "trtllm-serve", "stage speculative: speculative_algorithm",
                        "random-32000-100", "--random-input-len 32000 --random-output-len 100"}) {
    EXPECT_NE(r.output.find(s), std::string::npos) << s;
  }
  r = dry("mi300x-concurrency.yaml");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("random-3200-800@c128"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--max-concurrency 128"), std::string::npos);
  EXPECT_NE(r.output.find("mean_tpot_ms <= 50"), std::string::npos);
  for (const char* c : {"quickstart.yaml", "ci-perf.yaml"}) {
    r = dry(c);
    EXPECT_EQ(r.code, 0) << c << "\n" << r.output;
  }
  // The quickstart's multi-turn workload reproduces as bench flags.
  r = dry("quickstart.yaml");
  EXPECT_NE(r.output.find("--sharegpt-output-len 16 --multi-turn --multi-turn-max-turns 3 --max-concurrency 4"),
            std::string::npos) << r.output;
  // The study on the built-in engine: TP 2 against DP attention 2, the mixed combinations skipped by the constraint.
  for (const char* c : {"deepseek-r1-builtin.yaml", "qwen3-moe-builtin.yaml"}) {
    r = dry(c);
    ASSERT_EQ(r.code, 0) << c << "\n" << r.output;
    for (const char* s : {"--tp-size 2 --dp-size 2 --enable-dp-attention", "--tp-size 2 --ep-size 2 --compile eager",
                          "skipped: constraint 'enable_dp_attention == (dp_size == tp_size)' is false",
                          "stage speculative: speculative_algorithm", "random-2048-8"}) {
      EXPECT_NE(r.output.find(s), std::string::npos) << c << ": " << s << "\n" << r.output;
    }
  }
}

}  // namespace
}  // namespace servetune::testing
